//! Recurrent layers: ONNX's LSTM (timm's Sequencer2D, PyTorch's `nn.LSTM` by either exporter),
//! imported as the ops of one time step after another: the input's product by the constant
//! input weights for all steps at once, then per step the product of the previous hidden state
//! by the recurrent weights, the gates' activations and the elementwise cell update. It has
//! no IR op of its own, so every backend (the CPU reference and cuda's plans) runs it with the
//! ops it has; a sequence of `S` steps adds about 12 nodes per step and direction.
//!
//! Implemented as the ONNX spec defines it (opsets 7–22): forward, reverse and bidirectional,
//! both layouts, the biases, initial hidden and cell states (zeros when absent), peepholes,
//! `clip`, and the activations Sigmoid, Tanh and Relu in any of the three places. Refused by
//! name: `input_forget = 1`, `activation_alpha`/`activation_beta`, other activations, a
//! `sequence_lens` that is not the full length for every row, and weights not known at import.

use crate::ir::{Op, Unary};
use crate::onnx::fold::{Arr, Sym};
use crate::onnx::import::{fmt_syms, Ctx, Importer, Val};
use crate::onnx::Result as OnnxResult;
use crate::ops::ImportFn;

/// The ONNX op types imported as unrolled recurrences.
pub(crate) const ONNX: &[(&str, ImportFn)] = &[("LSTM", import_lstm)];

fn import_lstm(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    im.lstm(c)
}

/// A named value of the node being imported (the name keys IR constants: unique per node).
type Named = (String, Val);

/// One direction's weights, transposed for `x · Wᵀ`, and its activations `(f, g, h)`.
struct Direction {
    /// `[I, 4H]`, gates in ONNX's order i, o, f, c.
    w_t: Arr<f32>,
    /// `[H, 4H]`.
    r_t: Arr<f32>,
    /// `Wb + Rb`, `[4H]`, if the node has biases.
    bias: Option<Arr<f32>>,
    /// The peephole weights of the input, output and forget gates, `[H]` each.
    peep: Option<[Arr<f32>; 3]>,
    acts: [Unary; 3],
    reverse: bool,
}

/// An activation named in `activations`.
fn activation(c: &Ctx, name: &str) -> OnnxResult<Unary> {
    match name {
        "Sigmoid" => Ok(Unary::Sigmoid),
        "Tanh" => Ok(Unary::Tanh),
        "Relu" => Ok(Unary::Relu),
        other => Err(c.unsupported_attr(
            "activations",
            format!("{other:?} (Sigmoid, Tanh and Relu are supported)"),
        )),
    }
}

/// A float constant of the node's input `i`, or an error saying it must be one.
fn weight(im: &Importer, c: &Ctx, i: usize, what: &str) -> OnnxResult<Option<Arr<f32>>> {
    match im.get(c, i)? {
        None => Ok(None),
        Some(Val::F(a)) => Ok(Some(a)),
        Some(v) => Err(c.bad(format!(
            "{what} is {}; it must be a float constant known at import",
            v.kind()
        ))),
    }
}

/// `a[d]`'s `rows × cols` block (row-major), transposed to `cols × rows`.
fn transposed(a: &Arr<f32>, d: usize, rows: usize, cols: usize) -> Arr<f32> {
    let block = &a.data[d * rows * cols..(d + 1) * rows * cols];
    let mut t = vec![0.0; rows * cols];
    for r in 0..rows {
        for k in 0..cols {
            t[k * rows + r] = block[r * cols + k];
        }
    }
    Arr::new(vec![cols, rows], t)
}

impl Importer<'_> {
    pub(crate) fn lstm(&mut self, c: &Ctx) -> OnnxResult<Vec<Val>> {
        let direction = c.string("direction", "forward")?;
        let dirs = match direction.as_str() {
            "forward" | "reverse" => 1,
            "bidirectional" => 2,
            other => {
                return Err(c.unsupported_attr(
                    "direction",
                    format!("value {other:?} (forward, reverse, bidirectional)"),
                ))
            }
        };
        let layout = c.int("layout", 0)?;
        if !matches!(layout, 0 | 1) {
            return Err(c.unsupported_attr("layout", format!("value {layout} (0 or 1)")));
        }
        c.int_default_only("input_forget", 0)?;
        for a in ["activation_alpha", "activation_beta"] {
            if c.attr(a).is_some() {
                return Err(c.unsupported_attr(
                    a,
                    "given (only the activations Sigmoid, Tanh and Relu, which take none, are supported)",
                ));
            }
        }
        let clip = match c.attr("clip") {
            None => None,
            Some(_) => {
                let v = c.float("clip", 0.0)?;
                if v.is_nan() || v <= 0.0 {
                    return Err(c.bad(format!("clip {v}: expected a positive threshold")));
                }
                Some(Unary::Clip { min: -v, max: v })
            }
        };
        let acts: Vec<Unary> = match c.attr("activations") {
            None => [Unary::Sigmoid, Unary::Tanh, Unary::Tanh].repeat(dirs),
            Some(a) => {
                if a.strings.len() != 3 * dirs {
                    return Err(c.bad(format!(
                        "{} activations for {dirs} direction(s): expected {}",
                        a.strings.len(),
                        3 * dirs
                    )));
                }
                a.strings
                    .iter()
                    .map(|s| activation(c, &String::from_utf8_lossy(s)))
                    .collect::<OnnxResult<_>>()?
            }
        };
        let x = self.req(c, 0)?;
        let xs = x.sym_shape().map_err(|e| c.bad(e))?;
        if xs.len() != 3 {
            return Err(c.bad(format!("the input is {}; expected rank 3", fmt_syms(&xs))));
        }
        let (seq, batch, input) = if layout == 0 {
            (xs[0], xs[1], xs[2])
        } else {
            (xs[1], xs[0], xs[2])
        };
        if !seq.is_const() || !input.is_const() || seq.c < 1 {
            return Err(c.bad(format!(
                "the input is {}: the sequence length and input size must be fixed (and the \
                 sequence not empty)",
                fmt_syms(&xs)
            )));
        }
        let (seq, input) = (seq.c as usize, input.c as usize);
        let w = weight(self, c, 1, "W")?.ok_or_else(|| c.bad("required input 1 (W) is missing"))?;
        let r = weight(self, c, 2, "R")?.ok_or_else(|| c.bad("required input 2 (R) is missing"))?;
        if r.shape.len() != 3 || r.shape[0] != dirs || r.shape[1] != 4 * r.shape[2] {
            return Err(c.bad(format!(
                "R is {:?}; expected [{dirs}, 4·hidden, hidden]",
                r.shape
            )));
        }
        let hidden = r.shape[2];
        let hs = c.int("hidden_size", hidden as i64)?;
        if hs != hidden as i64 {
            return Err(c.bad(format!(
                "hidden_size {hs}, but R is {:?} (hidden {hidden})",
                r.shape
            )));
        }
        if w.shape != [dirs, 4 * hidden, input] {
            return Err(c.bad(format!(
                "W is {:?}; expected [{dirs}, {}, {input}]",
                w.shape,
                4 * hidden
            )));
        }
        let b = weight(self, c, 3, "B")?;
        if let Some(b) = &b {
            if b.shape != [dirs, 8 * hidden] {
                return Err(c.bad(format!(
                    "B is {:?}; expected [{dirs}, {}]",
                    b.shape,
                    8 * hidden
                )));
            }
        }
        // sequence_lens: every row's full length is the same computation as none.
        match self.get(c, 4)? {
            None => {}
            Some(Val::I(a)) if a.data.iter().all(|&l| l == Sym::k(seq as i64)) => {}
            Some(v) => {
                return Err(c.bad(format!(
                    "sequence_lens is {} other than the full length {seq} in every row: \
                     sequences of differing lengths are not supported",
                    v.kind()
                )))
            }
        }
        let p = weight(self, c, 7, "P")?;
        if let Some(p) = &p {
            if p.shape != [dirs, 3 * hidden] {
                return Err(c.bad(format!(
                    "P is {:?}; expected [{dirs}, {}]",
                    p.shape,
                    3 * hidden
                )));
            }
        }
        // Layout 1 holds the states batch first too: [B, dirs, H].
        let mut state_shape = [Sym::k(dirs as i64), batch, Sym::k(hidden as i64)];
        if layout == 1 {
            state_shape.swap(0, 1);
        }
        let mut states = Vec::new();
        for (i, what) in [(5, "initial_h"), (6, "initial_c")] {
            let v = self.get(c, i)?;
            if let Some(v) = &v {
                let s = v.sym_shape().map_err(|e| c.bad(e))?;
                if s != state_shape {
                    return Err(c.bad(format!(
                        "{what} is {}; expected {}",
                        fmt_syms(&s),
                        fmt_syms(&state_shape)
                    )));
                }
            }
            // A state of zeros known at import is the same as none (no product to compute).
            states.push(v.filter(|v| !matches!(v, Val::F(a) if a.data.iter().all(|&e| e == 0.0))));
        }
        let name = |what: &str| format!("{}:{what}", c.r.node);
        let mut x: Named = (c.n.input[0].clone(), x);
        if layout == 1 {
            let t = Op::Transpose {
                perm: vec![1, 0, 2],
            };
            x = (
                name("x_seq_first"),
                self.emit_tmp(c, t, &[x], "x_seq_first")?,
            );
        }
        let mut ys = Vec::new();
        let (mut last_h, mut last_c) = (Vec::new(), Vec::new());
        for d in 0..dirs {
            let bias = b.as_ref().map(|b| {
                let row = &b.data[d * 8 * hidden..(d + 1) * 8 * hidden];
                let (wb, rb) = row.split_at(4 * hidden);
                Arr::new(
                    vec![4 * hidden],
                    wb.iter().zip(rb).map(|(a, b)| a + b).collect(),
                )
            });
            let peep = p.as_ref().map(|p| {
                let row = &p.data[d * 3 * hidden..(d + 1) * 3 * hidden];
                [0, 1, 2]
                    .map(|k| Arr::new(vec![hidden], row[k * hidden..(k + 1) * hidden].to_vec()))
            });
            let dir = Direction {
                w_t: transposed(&w, d, 4 * hidden, input),
                r_t: transposed(&r, d, 4 * hidden, hidden),
                bias,
                peep,
                acts: [acts[3 * d], acts[3 * d + 1], acts[3 * d + 2]],
                reverse: direction == "reverse" || d == 1,
            };
            let init: Vec<Option<Named>> = (0..2)
                .map(|k| {
                    states[k]
                        .clone()
                        .map(|v| self.state_row(c, v, d, k, layout == 1))
                        .transpose()
                })
                .collect::<OnnxResult<_>>()?;
            let (y, h, cell) = self.lstm_direction(c, d, &dir, &x, seq, hidden, clip, init)?;
            ys.push(y);
            last_h.push(h);
            last_c.push(cell);
        }
        let used = |i: usize| {
            c.n.output
                .get(i)
                .is_some_and(|o| !o.is_empty() && self.used.contains(o.as_str()))
        };
        let (want_y, want_h, want_c) = (used(0), used(1), used(2));
        // Outputs no node reads are not computed; their slots hold a placeholder never read.
        let mut outs = vec![Val::F(Arr::scalar(0.0)); 3];
        if want_y {
            let mut per_dir = Vec::new();
            for (d, y) in ys.into_iter().enumerate() {
                // [S, B, H] -> [S, 1, B, H]
                let u = Op::Unsqueeze { axes: vec![1] };
                per_dir.push((name(&format!("y{d}")), self.emit_tmp(c, u, &[y], "y_dir")?));
            }
            let perm = (layout == 1).then_some(vec![2, 0, 1, 3]);
            outs[0] = self.lstm_output(c, 0, per_dir, 1, perm)?;
        }
        for (k, want, parts) in [(1, want_h, last_h), (2, want_c, last_c)] {
            if want {
                let perm = (layout == 1).then_some(vec![1, 0, 2]);
                outs[k] = self.lstm_output(c, k, parts, 0, perm)?;
            }
        }
        Ok(outs)
    }

    /// Direction `d`'s row `[1, B, H]` of an initial state `v` (`[dirs, B, H]`, or
    /// `[B, dirs, H]` if `batch_first`; k = 0 for h, 1 for c).
    fn state_row(
        &mut self,
        c: &Ctx,
        v: Val,
        d: usize,
        k: usize,
        batch_first: bool,
    ) -> OnnxResult<Named> {
        let what = ["h0", "c0"][k];
        let key = format!("{}:{what}_{d}", c.r.node);
        if let Val::F(a) = &v {
            let (dirs, hidden) = if batch_first {
                (a.shape[1], a.shape[2])
            } else {
                (a.shape[0], a.shape[2])
            };
            let batch = a.data.len() / (dirs * hidden);
            let at = |b: usize| {
                if batch_first {
                    (b * dirs + d) * hidden
                } else {
                    (d * batch + b) * hidden
                }
            };
            let row = (0..batch)
                .flat_map(|b| a.data[at(b)..at(b) + hidden].iter().copied())
                .collect();
            return Ok((key, Val::F(Arr::new(vec![1, batch, hidden], row))));
        }
        let axis = usize::from(batch_first) as i64;
        let slice = Op::Slice {
            starts: vec![d as i64],
            ends: vec![d as i64 + 1],
            axes: vec![axis],
            steps: vec![1],
        };
        let src = (c.n.input[5 + k].clone(), v);
        let mut row = self.emit_tmp(c, slice, &[src], what)?;
        if batch_first {
            let t = Op::Transpose {
                perm: vec![1, 0, 2],
            };
            row = self.emit_tmp(c, t, &[(key.clone(), row)], what)?;
        }
        Ok((key, row))
    }

    /// One direction over the whole sequence: `(Y as [S, B, H] in time order, last h, last c)`,
    /// the last two `[1, B, H]`.
    #[allow(clippy::too_many_arguments)]
    fn lstm_direction(
        &mut self,
        c: &Ctx,
        d: usize,
        dir: &Direction,
        x: &Named,
        seq: usize,
        hidden: usize,
        clip: Option<Unary>,
        init: Vec<Option<Named>>,
    ) -> OnnxResult<(Named, Named, Named)> {
        let key = |what: &str| format!("{}:{what}_{d}", c.r.node);
        let tmp = |im: &mut Self, op: Op, ins: &[Named], what: &str| -> OnnxResult<Named> {
            let v = im.emit_tmp(c, op, ins, what)?;
            Ok((format!("{}:{what}", c.r.node), v))
        };
        let un = |u: Unary| Op::Unary(u);
        let bin = |b: crate::ir::Binary| Op::Binary(b);
        use crate::ir::Binary::{Add, Mul};
        // x · Wᵀ (+ Wb + Rb) for every step at once: [S, B, 4H].
        let mut xw = tmp(
            self,
            Op::MatMul,
            &[x.clone(), (key("Wt"), Val::F(dir.w_t.clone()))],
            "xw",
        )?;
        if let Some(b) = &dir.bias {
            xw = tmp(
                self,
                bin(Add),
                &[xw, (key("bias"), Val::F(b.clone()))],
                "xwb",
            )?;
        }
        let r_t: Named = (key("Rt"), Val::F(dir.r_t.clone()));
        let peep: Option<[Named; 3]> = dir
            .peep
            .as_ref()
            .map(|p| [0, 1, 2].map(|k| (key(["Pi", "Po", "Pf"][k]), Val::F(p[k].clone()))));
        let [f, g, h] = dir.acts;
        let mut init = init.into_iter();
        let (mut hp, mut cp) = (init.next().flatten(), init.next().flatten());
        let mut outs: Vec<Option<Named>> = vec![None; seq];
        let steps: Vec<usize> = if dir.reverse {
            (0..seq).rev().collect()
        } else {
            (0..seq).collect()
        };
        for t in steps {
            let step = Op::Slice {
                starts: vec![t as i64],
                ends: vec![t as i64 + 1],
                axes: vec![0],
                steps: vec![1],
            };
            let mut gates = tmp(self, step, std::slice::from_ref(&xw), "step")?;
            if let Some(hp) = &hp {
                let hr = tmp(self, Op::MatMul, &[hp.clone(), r_t.clone()], "hr")?;
                gates = tmp(self, bin(Add), &[gates, hr], "gates")?;
            }
            let split = Op::Split {
                axis: 2,
                sizes: vec![hidden; 4],
            };
            self.fresh += 1;
            let outs4: Vec<String> = (0..4)
                .map(|k| format!("{}:gate{}_{}", c.r.node, k, self.fresh))
                .collect();
            let g4 = self.emit(c, split, &[gates], outs4.clone())?;
            let mut g4: Vec<Named> = outs4.into_iter().zip(g4).collect();
            let mut cc = g4.pop().ok_or_else(|| c.bad("internal: gates"))?;
            let mut fg = g4.pop().ok_or_else(|| c.bad("internal: gates"))?;
            let mut og = g4.pop().ok_or_else(|| c.bad("internal: gates"))?;
            let mut ig = g4.pop().ok_or_else(|| c.bad("internal: gates"))?;
            if let (Some(p), Some(cp)) = (&peep, &cp) {
                let pi = tmp(self, bin(Mul), &[cp.clone(), p[0].clone()], "pi")?;
                ig = tmp(self, bin(Add), &[ig, pi], "ip")?;
                let pf = tmp(self, bin(Mul), &[cp.clone(), p[2].clone()], "pf")?;
                fg = tmp(self, bin(Add), &[fg, pf], "fp")?;
            }
            if let Some(clip) = clip {
                ig = tmp(self, un(clip), &[ig], "ic")?;
                fg = tmp(self, un(clip), &[fg], "fc")?;
                cc = tmp(self, un(clip), &[cc], "cc")?;
            }
            let i = tmp(self, un(f), &[ig], "i")?;
            let fgate = tmp(self, un(f), &[fg], "f")?;
            let cand = tmp(self, un(g), &[cc], "g")?;
            let new_c = tmp(self, bin(Mul), &[i, cand], "ig")?;
            let new_c = match &cp {
                Some(cp) => {
                    let kept = tmp(self, bin(Mul), &[fgate, cp.clone()], "fc_prev")?;
                    tmp(self, bin(Add), &[kept, new_c], "c")?
                }
                None => new_c,
            };
            if let Some(p) = &peep {
                let po = tmp(self, bin(Mul), &[new_c.clone(), p[1].clone()], "po")?;
                og = tmp(self, bin(Add), &[og, po], "op")?;
            }
            if let Some(clip) = clip {
                og = tmp(self, un(clip), &[og], "oc")?;
            }
            let o = tmp(self, un(f), &[og], "o")?;
            let hc = tmp(self, un(h), std::slice::from_ref(&new_c), "hc")?;
            let new_h = tmp(self, bin(Mul), &[o, hc], "h")?;
            outs[t] = Some(new_h.clone());
            hp = Some(new_h);
            cp = Some(new_c);
        }
        let ys: Vec<Named> = outs.into_iter().flatten().collect();
        let y = if ys.len() == 1 {
            ys[0].clone()
        } else {
            tmp(self, Op::Concat { axis: 0 }, &ys, "y")?
        };
        let missing = || c.bad("internal: an empty sequence");
        Ok((y, hp.ok_or_else(missing)?, cp.ok_or_else(missing)?))
    }

    /// Output `k` of the node: `parts` (one per direction) concatenated along `axis`, then
    /// transposed by `perm` for layout 1.
    fn lstm_output(
        &mut self,
        c: &Ctx,
        k: usize,
        parts: Vec<Named>,
        axis: i64,
        perm: Option<Vec<usize>>,
    ) -> OnnxResult<Val> {
        let out = self.out_name(c, k);
        let mut ops = Vec::new();
        if parts.len() > 1 {
            ops.push(Op::Concat { axis });
        }
        if let Some(perm) = perm {
            ops.push(Op::Transpose { perm });
        }
        // At least one op writes the output under its own name (an Identity if no other).
        if ops.is_empty() {
            ops.push(Op::Identity);
        }
        let last = ops.len() - 1;
        let mut cur = parts;
        for (i, op) in ops.into_iter().enumerate() {
            let v = if i == last {
                self.emit(c, op, &cur, vec![out.clone()])?
                    .pop()
                    .ok_or_else(|| c.bad("internal: no output"))?
            } else {
                self.emit_tmp(c, op, &cur, "joined")?
            };
            cur = vec![(format!("{}:out{k}", c.r.node), v)];
        }
        Ok(cur.pop().ok_or_else(|| c.bad("internal: no output"))?.1)
    }
}

#[cfg(test)]
mod tests {
    use crate::backend::{Backend, Precision};
    use crate::ir::Tensor;
    use crate::onnx::proto::{attribute_proto::AttributeType, AttributeProto, NodeProto};
    use crate::ops::testing::{floats, import, ints, node, with_int};

    const S: usize = 3;
    const I: usize = 2;
    const H: usize = 2;

    fn with_strings(mut n: NodeProto, name: &str, v: &[&str]) -> NodeProto {
        n.attribute.push(AttributeProto {
            name: Some(name.into()),
            strings: v.iter().map(|s| s.as_bytes().to_vec()).collect(),
            r#type: Some(AttributeType::Strings as i32),
            ..Default::default()
        });
        n
    }

    fn with_float(mut n: NodeProto, name: &str, v: f32) -> NodeProto {
        n.attribute.push(AttributeProto {
            name: Some(name.into()),
            f: Some(v),
            r#type: Some(AttributeType::Float as i32),
            ..Default::default()
        });
        n
    }

    /// `x [S, 1, I]` through a forward LSTM with weights `W`, `R` (and `extra` inputs).
    fn lstm(n: NodeProto, extra: Vec<crate::onnx::proto::TensorProto>) -> Result<Vec<f32>, String> {
        let wv: Vec<f32> = (0..4 * H * I)
            .map(|k| ((k * 5) % 7) as f32 * 0.1 - 0.3)
            .collect();
        let rv: Vec<f32> = (0..4 * H * H)
            .map(|k| ((k * 3) % 5) as f32 * 0.1 - 0.2)
            .collect();
        let mut inits = vec![
            floats("W", &[1, (4 * H) as i64, I as i64], &wv),
            floats("R", &[1, (4 * H) as i64, H as i64], &rv),
        ];
        inits.extend(extra);
        let x: Vec<f32> = (0..S * I).map(|k| k as f32 * 0.25 - 0.5).collect();
        // The reference evaluator runs the unrolled graph as imported; the CPU backend's
        // passes fuse the step's sum into its product (another rounding order), so the two
        // agree to rounding, not bit for bit as `testing::run` asks.
        let g = import(vec![n], inits, &[S, 1, I], false)?;
        let feed = Tensor::new(vec![S, 1, I], x.clone()).unwrap();
        let reference = crate::reference::interpret(&g, S, &[feed]).unwrap();
        let mut cpu = crate::CpuBackend::new(1)
            .compile(&g, S, Precision::Fp32)
            .unwrap();
        cpu.input_mut().copy_from_slice(&x);
        cpu.run().unwrap();
        for (a, b) in cpu.output().iter().zip(&reference[0].data) {
            assert!((a - b).abs() < 1e-6, "cpu {a} vs reference {b}");
        }
        Ok(reference[0].data.clone())
    }

    /// The spec's equations, one step at a time, for the forward LSTM of [`lstm`] (no bias,
    /// zero states, default activations): the unrolled import computes them.
    #[test]
    fn a_forward_lstm_computes_the_specs_equations() {
        let y = lstm(node("LSTM", &["x", "W", "R"], "y"), vec![]).unwrap();
        let wv: Vec<f32> = (0..4 * H * I)
            .map(|k| ((k * 5) % 7) as f32 * 0.1 - 0.3)
            .collect();
        let rv: Vec<f32> = (0..4 * H * H)
            .map(|k| ((k * 3) % 5) as f32 * 0.1 - 0.2)
            .collect();
        let sig = |v: f32| 1.0 / (1.0 + (-v).exp());
        let (mut h, mut c) = (vec![0.0f32; H], vec![0.0f32; H]);
        let mut want = Vec::new();
        for t in 0..S {
            let x: Vec<f32> = (0..I).map(|k| (t * I + k) as f32 * 0.25 - 0.5).collect();
            // Gates i, o, f, c: W's and R's rows in that order.
            let gate = |g: usize, j: usize| {
                let row = g * H + j;
                (0..I).map(|k| x[k] * wv[row * I + k]).sum::<f32>()
                    + (0..H).map(|k| h[k] * rv[row * H + k]).sum::<f32>()
            };
            let mut nh = vec![0.0; H];
            for j in 0..H {
                let (i, o, f, g) = (
                    sig(gate(0, j)),
                    sig(gate(1, j)),
                    sig(gate(2, j)),
                    gate(3, j).tanh(),
                );
                c[j] = f * c[j] + i * g;
                nh[j] = o * c[j].tanh();
            }
            h = nh;
            want.extend_from_slice(&h);
        }
        assert_eq!(y.len(), want.len());
        for (got, want) in y.iter().zip(&want) {
            assert!((got - want).abs() < 1e-5, "{y:?} vs {want:?}");
        }
    }

    /// What the import does not implement is refused by name, saying what is supported.
    #[test]
    fn an_lstm_it_does_not_implement_is_refused_by_name() {
        let base = || node("LSTM", &["x", "W", "R"], "y");
        let cases: Vec<(NodeProto, Vec<_>, &str)> = vec![
            (with_int(base(), "input_forget", 1), vec![], "input_forget"),
            (
                with_strings(base(), "activations", &["Sigmoid", "Elu", "Tanh"]),
                vec![],
                "Elu",
            ),
            (
                with_float(base(), "activation_alpha", 0.5),
                vec![],
                "activation_alpha",
            ),
            (with_int(base(), "layout", 2), vec![], "layout"),
            (
                node("LSTM", &["x", "W", "R", "", "lens"], "y"),
                vec![ints("lens", &[1], &[2])],
                "sequence_lens",
            ),
            (with_int(base(), "hidden_size", 3), vec![], "hidden_size 3"),
        ];
        for (n, extra, want) in cases {
            let e = lstm(n, extra).unwrap_err();
            assert!(e.contains(want), "{want}: {e}");
        }
        // The full length in every row is the same as no sequence_lens.
        let full = lstm(
            node("LSTM", &["x", "W", "R", "", "lens"], "y"),
            vec![ints("lens", &[1], &[S as i64])],
        )
        .unwrap();
        assert_eq!(full, lstm(base(), vec![]).unwrap());
    }
}
