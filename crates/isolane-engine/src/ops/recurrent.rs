//! Recurrent layers: ONNX's LSTM (timm's Sequencer2D, PyTorch's `nn.LSTM` by either exporter),
//! GRU and RNN, imported as the ops of one time step after another: the input's product by
//! the constant input weights for all steps at once, then per step the product of the previous
//! hidden state by the recurrent weights, the gates' activations and the elementwise state
//! update. They have no IR op of their own, so every backend (the CPU reference and cuda's
//! plans) runs them with the ops it has; a sequence of `S` steps adds about 12 nodes per step
//! and direction, so a sequence longer than [`MAX_UNROLLED_STEPS`] is refused by name rather
//! than unrolled into millions of nodes.
//!
//! Implemented as the ONNX spec defines them (opsets 7–22): forward, reverse and
//! bidirectional, both layouts, the biases, initial states (zeros when absent), LSTM's
//! peepholes, GRU's `linear_before_reset` both ways, `clip`, and the activations Sigmoid, Tanh
//! and Relu in any place. Refused by name: LSTM's `input_forget = 1`,
//! `activation_alpha`/`activation_beta`, other activations, a `sequence_lens` that is not the
//! full length for every row, and weights not known at import.

use crate::ir::{Op, Unary};
use crate::onnx::fold::{Arr, Sym};
use crate::onnx::import::{fmt_syms, Ctx, Importer, Val};
use crate::onnx::Result as OnnxResult;
use crate::ops::ImportFn;

/// The most time steps a recurrence is unrolled into (about 12 nodes a step and direction:
/// ~200 k nodes here). Longer than any model the conformance suite holds by far; a length past
/// it is a file's claim that would cost memory in proportion, not a model this engine runs.
pub const MAX_UNROLLED_STEPS: usize = 1 << 14;

/// The ONNX op types imported as unrolled recurrences.
pub(crate) const ONNX: &[(&str, ImportFn)] = &[
    ("LSTM", import_lstm),
    ("GRU", import_gru),
    ("RNN", import_rnn),
];

fn import_lstm(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    im.recurrence(c, Cell::Lstm)
}

fn import_gru(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    let linear_before_reset = c.int("linear_before_reset", 0)? != 0;
    im.recurrence(
        c,
        Cell::Gru {
            linear_before_reset,
        },
    )
}

fn import_rnn(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    im.recurrence(c, Cell::Rnn)
}

/// Which recurrence a node computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cell {
    /// Gates i, o, f, c; a cell state; activations f, g, h.
    Lstm,
    /// Gates z, r, h; activations f, g. `linear_before_reset`: the reset gate multiplies
    /// `H·Rhᵀ + Rbh` (PyTorch's GRU) rather than H before its product.
    Gru { linear_before_reset: bool },
    /// One gate; activation f.
    Rnn,
}

impl Cell {
    fn gates(self) -> usize {
        match self {
            Cell::Lstm => 4,
            Cell::Gru { .. } => 3,
            Cell::Rnn => 1,
        }
    }

    fn default_acts(self) -> &'static [Unary] {
        match self {
            Cell::Lstm => &[Unary::Sigmoid, Unary::Tanh, Unary::Tanh],
            Cell::Gru { .. } => &[Unary::Sigmoid, Unary::Tanh],
            Cell::Rnn => &[Unary::Tanh],
        }
    }
}

/// A named value of the node being imported (the name keys IR constants: unique per node).
type Named = (String, Val);

/// One direction's weights, transposed for `x · Wᵀ`, and its activations.
struct Direction {
    /// `[I, gates·H]`, gates in ONNX's order (LSTM i, o, f, c; GRU z, r, h).
    w_t: Arr<f32>,
    /// `[H, gates·H]`; a GRU without `linear_before_reset`: `[H, 2H]`, the z and r rows only.
    r_t: Arr<f32>,
    /// A GRU without `linear_before_reset`: `Rhᵀ`, `[H, H]` (it multiplies `r ⊙ H`).
    r_h_t: Option<Arr<f32>>,
    /// The biases added to `x · Wᵀ`, `[gates·H]`: `Wb + Rb`, but for a GRU with
    /// `linear_before_reset` whose `Rbh` is inside the reset product.
    bias: Option<Arr<f32>>,
    /// A GRU with `linear_before_reset`: `[0, 0, Rbh]`, added to `H · Rᵀ`.
    rbh: Option<Arr<f32>>,
    /// LSTM's peephole weights of the input, output and forget gates, `[H]` each.
    peep: Option<[Arr<f32>; 3]>,
    acts: Vec<Unary>,
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

/// Rows `from..to` of `a[d]` (`a` is `[dirs, rows, cols]`), transposed to `cols × (to - from)`.
fn transposed(a: &Arr<f32>, d: usize, from: usize, to: usize) -> Arr<f32> {
    let (rows, cols) = (a.shape[1], a.shape[2]);
    let block = &a.data[d * rows * cols..(d + 1) * rows * cols];
    let n = to - from;
    let mut t = vec![0.0; n * cols];
    for r in from..to {
        for k in 0..cols {
            t[k * n + r - from] = block[r * cols + k];
        }
    }
    Arr::new(vec![cols, n], t)
}

impl Importer<'_> {
    fn recurrence(&mut self, c: &Ctx, cell: Cell) -> OnnxResult<Vec<Val>> {
        let g = cell.gates();
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
        if cell == Cell::Lstm {
            c.int_default_only("input_forget", 0)?;
        }
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
        let n_acts = cell.default_acts().len();
        let acts: Vec<Unary> = match c.attr("activations") {
            None => cell.default_acts().repeat(dirs),
            Some(a) => {
                if a.strings.len() != n_acts * dirs {
                    return Err(c.bad(format!(
                        "{} activations for {dirs} direction(s): expected {}",
                        a.strings.len(),
                        n_acts * dirs
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
        if seq > MAX_UNROLLED_STEPS {
            return Err(c.bad(format!(
                "the sequence has {seq} steps; a recurrence is unrolled step by step (about 12 \
                 nodes a step), and at most {MAX_UNROLLED_STEPS} steps are taken"
            )));
        }
        let w = weight(self, c, 1, "W")?.ok_or_else(|| c.bad("required input 1 (W) is missing"))?;
        let r = weight(self, c, 2, "R")?.ok_or_else(|| c.bad("required input 2 (R) is missing"))?;
        if r.shape.len() != 3 || r.shape[0] != dirs || r.shape[1] != g * r.shape[2] {
            return Err(c.bad(format!(
                "R is {:?}; expected [{dirs}, {g}·hidden, hidden]",
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
        if w.shape != [dirs, g * hidden, input] {
            return Err(c.bad(format!(
                "W is {:?}; expected [{dirs}, {}, {input}]",
                w.shape,
                g * hidden
            )));
        }
        let b = weight(self, c, 3, "B")?;
        if let Some(b) = &b {
            if b.shape != [dirs, 2 * g * hidden] {
                return Err(c.bad(format!(
                    "B is {:?}; expected [{dirs}, {}]",
                    b.shape,
                    2 * g * hidden
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
        let p = if cell == Cell::Lstm {
            weight(self, c, 7, "P")?
        } else {
            None
        };
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
        let state_inputs: &[(usize, &str)] = if cell == Cell::Lstm {
            &[(5, "initial_h"), (6, "initial_c")]
        } else {
            &[(5, "initial_h")]
        };
        for &(i, what) in state_inputs {
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
            let gh = g * hidden;
            let lbr = cell
                == Cell::Gru {
                    linear_before_reset: true,
                };
            let gru_plain = cell
                == Cell::Gru {
                    linear_before_reset: false,
                };
            let (bias, rbh) = match &b {
                None => (None, None),
                Some(b) => {
                    let row = &b.data[d * 2 * gh..(d + 1) * 2 * gh];
                    let (wb, rb) = row.split_at(gh);
                    let mut sum: Vec<f32> = wb.iter().zip(rb).map(|(a, b)| a + b).collect();
                    let mut rbh = None;
                    if lbr {
                        // Rbh is added inside the reset product, not to x · Wᵀ.
                        sum[2 * hidden..].copy_from_slice(&wb[2 * hidden..]);
                        let mut r3 = vec![0.0; gh];
                        r3[2 * hidden..].copy_from_slice(&rb[2 * hidden..]);
                        rbh = Some(Arr::new(vec![gh], r3));
                    }
                    (Some(Arr::new(vec![gh], sum)), rbh)
                }
            };
            let peep = p.as_ref().map(|p| {
                let row = &p.data[d * 3 * hidden..(d + 1) * 3 * hidden];
                [0, 1, 2]
                    .map(|k| Arr::new(vec![hidden], row[k * hidden..(k + 1) * hidden].to_vec()))
            });
            let r_rows = if gru_plain { 2 * hidden } else { gh };
            let dir = Direction {
                w_t: transposed(&w, d, 0, gh),
                r_t: transposed(&r, d, 0, r_rows),
                r_h_t: gru_plain.then(|| transposed(&r, d, 2 * hidden, gh)),
                bias,
                rbh,
                peep,
                acts: acts[n_acts * d..n_acts * (d + 1)].to_vec(),
                reverse: direction == "reverse" || d == 1,
            };
            let init: Vec<Option<Named>> = (0..state_inputs.len())
                .map(|k| {
                    states[k]
                        .clone()
                        .map(|v| self.state_row(c, v, d, k, layout == 1))
                        .transpose()
                })
                .collect::<OnnxResult<_>>()?;
            let (y, h, cell_state) =
                self.direction(c, cell, d, &dir, &x, seq, hidden, clip, init)?;
            ys.push(y);
            last_h.push(h);
            last_c.extend(cell_state);
        }
        let used = |i: usize| {
            c.n.output
                .get(i)
                .is_some_and(|o| !o.is_empty() && self.used.contains(o.as_str()))
        };
        let (want_y, want_h, want_c) = (used(0), used(1), used(2));
        // Outputs no node reads are not computed; their slots hold a placeholder never read.
        let mut outs = vec![Val::F(Arr::scalar(0.0)); if cell == Cell::Lstm { 3 } else { 2 }];
        if want_y {
            let mut per_dir = Vec::new();
            for (d, y) in ys.into_iter().enumerate() {
                // [S, B, H] -> [S, 1, B, H]
                let u = Op::Unsqueeze { axes: vec![1] };
                per_dir.push((name(&format!("y{d}")), self.emit_tmp(c, u, &[y], "y_dir")?));
            }
            let perm = (layout == 1).then_some(vec![2, 0, 1, 3]);
            outs[0] = self.joined_output(c, 0, per_dir, 1, perm)?;
        }
        for (k, want, parts) in [(1, want_h, last_h), (2, want_c, last_c)] {
            if want && k < outs.len() {
                let perm = (layout == 1).then_some(vec![1, 0, 2]);
                outs[k] = self.joined_output(c, k, parts, 0, perm)?;
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

    /// One direction over the whole sequence: `(Y as [S, B, H] in time order, last h, LSTM's
    /// last c)`, the last two `[1, B, H]`.
    #[allow(clippy::too_many_arguments)]
    fn direction(
        &mut self,
        c: &Ctx,
        cell: Cell,
        d: usize,
        dir: &Direction,
        x: &Named,
        seq: usize,
        hidden: usize,
        clip: Option<Unary>,
        init: Vec<Option<Named>>,
    ) -> OnnxResult<(Named, Named, Option<Named>)> {
        let key = |what: &str| format!("{}:{what}_{d}", c.r.node);
        let tmp = |im: &mut Self, op: Op, ins: &[Named], what: &str| -> OnnxResult<Named> {
            let v = im.emit_tmp(c, op, ins, what)?;
            Ok((format!("{}:{what}", c.r.node), v))
        };
        use crate::ir::Binary::{Add, Mul, Sub};
        let bin = |im: &mut Self, b, x: Named, y: Named, what: &str| {
            tmp(im, Op::Binary(b), &[x, y], what)
        };
        // An activation of `x`, clipped first if the node says so.
        let act = |im: &mut Self, u: Unary, mut x: Named, what: &str| -> OnnxResult<Named> {
            if let Some(clip) = clip {
                x = tmp(im, Op::Unary(clip), &[x], "clipped")?;
            }
            tmp(im, Op::Unary(u), &[x], what)
        };
        let split = |im: &mut Self, x: Named, n: usize| -> OnnxResult<Vec<Named>> {
            im.fresh += 1;
            let names: Vec<String> = (0..n)
                .map(|k| format!("{}:gate{k}_{}", c.r.node, im.fresh))
                .collect();
            let op = Op::Split {
                axis: 2,
                sizes: vec![hidden; n],
            };
            let v = im.emit(c, op, &[x], names.clone())?;
            Ok(names.into_iter().zip(v).collect())
        };
        // x · Wᵀ (+ biases) for every step at once: [S, B, gates·H].
        let mut xw = tmp(
            self,
            Op::MatMul,
            &[x.clone(), (key("Wt"), Val::F(dir.w_t.clone()))],
            "xw",
        )?;
        if let Some(b) = &dir.bias {
            xw = bin(self, Add, xw, (key("bias"), Val::F(b.clone())), "xwb")?;
        }
        let r_t: Named = (key("Rt"), Val::F(dir.r_t.clone()));
        let r_h_t: Option<Named> = dir.r_h_t.as_ref().map(|r| (key("Rht"), Val::F(r.clone())));
        let rbh: Option<Named> = dir.rbh.as_ref().map(|r| (key("Rbh"), Val::F(r.clone())));
        let one: Named = (key("one"), Val::F(Arr::new(vec![1], vec![1.0])));
        let peep: Option<[Named; 3]> = dir
            .peep
            .as_ref()
            .map(|p| [0, 1, 2].map(|k| (key(["Pi", "Po", "Pf"][k]), Val::F(p[k].clone()))));
        let f = dir.acts[0];
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
            let xt = tmp(self, step, std::slice::from_ref(&xw), "step")?;
            // H · Rᵀ (+ Rbh for a GRU with linear_before_reset; that alone without H).
            let hr = match (&hp, &rbh) {
                (Some(hp), _) => {
                    let hr = tmp(self, Op::MatMul, &[hp.clone(), r_t.clone()], "hr")?;
                    Some(match &rbh {
                        Some(rbh) => bin(self, Add, hr, rbh.clone(), "hrb")?,
                        None => hr,
                    })
                }
                (None, _) => None,
            };
            let new_h = match cell {
                Cell::Rnn => {
                    let pre = match hr {
                        Some(hr) => bin(self, Add, xt, hr, "pre")?,
                        None => xt,
                    };
                    act(self, f, pre, "h")?
                }
                Cell::Lstm => {
                    let gates = match hr {
                        Some(hr) => bin(self, Add, xt, hr, "gates")?,
                        None => xt,
                    };
                    let [mut ig, mut og, mut fg, cc] =
                        <[Named; 4]>::try_from(split(self, gates, 4)?)
                            .map_err(|_| c.bad("internal: gates"))?;
                    if let (Some(p), Some(cp)) = (&peep, &cp) {
                        let pi = bin(self, Mul, cp.clone(), p[0].clone(), "pi")?;
                        ig = bin(self, Add, ig, pi, "ip")?;
                        let pf = bin(self, Mul, cp.clone(), p[2].clone(), "pf")?;
                        fg = bin(self, Add, fg, pf, "fp")?;
                    }
                    let i = act(self, f, ig, "i")?;
                    let fgate = act(self, f, fg, "f")?;
                    let cand = act(self, dir.acts[1], cc, "g")?;
                    let mut new_c = bin(self, Mul, i, cand, "ig")?;
                    if let Some(cp) = &cp {
                        let kept = bin(self, Mul, fgate, cp.clone(), "fc_prev")?;
                        new_c = bin(self, Add, kept, new_c, "c")?;
                    }
                    if let Some(p) = &peep {
                        let po = bin(self, Mul, new_c.clone(), p[1].clone(), "po")?;
                        og = bin(self, Add, og, po, "op")?;
                    }
                    let o = act(self, f, og, "o")?;
                    // h(C) is not clipped: clip bounds the gates' inputs only.
                    let hc = tmp(
                        self,
                        Op::Unary(dir.acts[2]),
                        std::slice::from_ref(&new_c),
                        "hc",
                    )?;
                    cp = Some(new_c);
                    bin(self, Mul, o, hc, "h")?
                }
                Cell::Gru {
                    linear_before_reset,
                } => {
                    let [xz, xr, xh] = <[Named; 3]>::try_from(split(self, xt, 3)?)
                        .map_err(|_| c.bad("internal: gates"))?;
                    // The z and r gates' sums; what the reset gate multiplies.
                    let (zpre, rpre, reset_of) = match hr {
                        None => (
                            xz,
                            xr,
                            if linear_before_reset {
                                rbh.clone()
                            } else {
                                None
                            },
                        ),
                        Some(hr) => {
                            let n = if linear_before_reset { 3 } else { 2 };
                            let mut parts = split(self, hr, n)?;
                            let hh = if linear_before_reset {
                                parts.pop()
                            } else {
                                None
                            };
                            let [hz, hrr] = <[Named; 2]>::try_from(parts)
                                .map_err(|_| c.bad("internal: gates"))?;
                            let zpre = bin(self, Add, xz, hz, "zpre")?;
                            let rpre = bin(self, Add, xr, hrr, "rpre")?;
                            (zpre, rpre, hh.or_else(|| hp.clone()))
                        }
                    };
                    let z = act(self, f, zpre, "z")?;
                    let r = act(self, f, rpre, "r")?;
                    // Without a previous state and linear_before_reset 0, r ⊙ H is 0; with
                    // linear_before_reset and no bias, r ⊙ Rbh is 0 too.
                    let npre = match reset_of {
                        None => xh,
                        Some(v) => {
                            let rv = if linear_before_reset && hp.is_none() {
                                // Rbh alone, [gates·H] with z's and r's parts 0: its h part.
                                let Val::F(a) = &v.1 else {
                                    return Err(c.bad("internal: Rbh"));
                                };
                                let h3 = Arr::new(vec![hidden], a.data[2 * hidden..].to_vec());
                                bin(self, Mul, r, (key("Rbh_h"), Val::F(h3)), "rv")?
                            } else {
                                bin(self, Mul, r, v, "rv")?
                            };
                            let rv = match (&r_h_t, linear_before_reset) {
                                (Some(rh), false) => {
                                    tmp(self, Op::MatMul, &[rv, rh.clone()], "rh")?
                                }
                                _ => rv,
                            };
                            bin(self, Add, xh, rv, "npre")?
                        }
                    };
                    let n = act(self, dir.acts[1], npre, "n")?;
                    // H = (1 - z) ⊙ n + z ⊙ H_prev
                    let keep = bin(self, Sub, one.clone(), z.clone(), "one_minus_z")?;
                    let new_h = bin(self, Mul, keep, n, "zn")?;
                    match &hp {
                        Some(hp) => {
                            let kept = bin(self, Mul, z, hp.clone(), "zh")?;
                            bin(self, Add, new_h, kept, "h")?
                        }
                        None => new_h,
                    }
                }
            };
            outs[t] = Some(new_h.clone());
            hp = Some(new_h);
        }
        let ys: Vec<Named> = outs.into_iter().flatten().collect();
        let y = if ys.len() == 1 {
            ys[0].clone()
        } else {
            tmp(self, Op::Concat { axis: 0 }, &ys, "y")?
        };
        let missing = || c.bad("internal: an empty sequence");
        Ok((y, hp.ok_or_else(missing)?, cp))
    }

    /// Output `k` of the node: `parts` (one per direction) concatenated along `axis`, then
    /// transposed by `perm` for layout 1.
    fn joined_output(
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
