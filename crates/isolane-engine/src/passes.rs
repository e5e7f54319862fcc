//! Graph passes, run once at compile time (never per job):
//!
//! 1. identity bypass (Identity / Dropout-as-identity vanish);
//! 2. constant folding (every node whose inputs are all constants is evaluated on the CPU);
//! 3. BatchNorm folding into the preceding Conv or Linear (weights rescaled, bias adjusted);
//! 4. MatMul / Gemm with a constant 2-D weight (and a following constant bias Add) → Linear;
//! 5. `x * sigmoid(x)` → SiLU; `(x * (erf(x / √2) + 1)) * 0.5` → GELU (how ONNX exports them);
//! 6. residual fusion: `Conv(x) + r` → Conv with a fused residual input;
//! 7. activation fusion into Conv/Linear epilogues (ReLU, ReLU6, GELU, SiLU, HardSwish...);
//! 8. dead-code elimination and compaction.
//!
//! Every rewrite keeps the graph's outputs numerically equal to the unoptimised graph (up to
//! f32 rounding from refactoring BN into the weights).

use std::sync::Arc;

use crate::error::Result;
use crate::ir::{Binary, ConvAttrs, Graph, Node, Op, Tensor, Unary, ValueId, ValueKind};
use crate::reference::eval_node_within;

/// The most f32 elements constant folding evaluates for one node (256 MiB): shape constants and
/// folded weights of real models are far below it.
pub const MAX_FOLD_NODE_ELEMENTS: u128 = 1 << 26;

/// The most f32 elements constant folding creates for a whole graph: 1 GiB, or as many as the
/// graph's own constants where those are more (folding transposes or rescales weights, which
/// makes at most about as many again). Bounds what a crafted model can make folding allocate
/// by the size of its file.
pub fn fold_budget(g: &Graph) -> u128 {
    (1u128 << 28).max(g.constant_elements() as u128)
}

/// Which passes to run (all by default).
#[derive(Clone, Copy, Debug)]
pub struct PassOptions {
    pub fold_constants: bool,
    pub fold_batchnorm: bool,
    pub to_linear: bool,
    pub fuse: bool,
    /// General Gemms and reversing Slices rewritten into ops every backend lowers, first
    /// (`crate::decompose`).
    pub decompose: bool,
}

impl Default for PassOptions {
    fn default() -> Self {
        PassOptions {
            fold_constants: true,
            fold_batchnorm: true,
            to_linear: true,
            fuse: true,
            decompose: true,
        }
    }
}

/// Runs every pass; the result is a new, compacted graph.
pub fn optimize(g: &Graph, batch: usize) -> Result<Graph> {
    optimize_with(g, batch, PassOptions::default())
}

/// Runs the selected passes.
pub fn optimize_with(g: &Graph, batch: usize, opts: PassOptions) -> Result<Graph> {
    g.validate()?;
    let budget = fold_budget(g);
    let g = if opts.decompose {
        crate::decompose::general_forms(g, batch)?
    } else {
        g.clone()
    };
    let mut p = Rewriter {
        dead: vec![false; g.nodes.len()],
        shapes: g.infer_shapes(batch)?,
        g,
    };
    p.bypass_identities();
    if opts.fold_constants {
        p.fold_constants(batch, budget)?;
    }
    if opts.fold_batchnorm {
        p.fold_batchnorm();
    }
    if opts.to_linear {
        p.matmul_to_linear();
    }
    if opts.fuse {
        p.fuse_silu();
        p.fuse_gelu();
        p.fuse_residual();
        p.fuse_activations();
    }
    let out = p.compact();
    out.validate()?;
    Ok(out)
}

struct Rewriter {
    g: Graph,
    dead: Vec<bool>,
    /// Shapes of the original values (rewrites never change a surviving value's shape).
    shapes: Vec<Vec<usize>>,
}

impl Rewriter {
    fn uses(&self) -> Vec<usize> {
        let mut u = vec![0; self.g.values.len()];
        for (i, n) in self.g.nodes.iter().enumerate() {
            if !self.dead[i] {
                n.inputs.iter().for_each(|&v| u[v] += 1);
            }
        }
        self.g.outputs.iter().for_each(|&v| u[v] += 1);
        u
    }

    /// The single live consumer of `v` (node index), if `v` has exactly one use and is not a
    /// graph output.
    fn sole_consumer(&self, v: ValueId, uses: &[usize]) -> Option<usize> {
        if uses[v] != 1 || self.g.outputs.contains(&v) {
            return None;
        }
        self.g
            .nodes
            .iter()
            .enumerate()
            .find(|(i, n)| !self.dead[*i] && n.inputs.contains(&v))
            .map(|(i, _)| i)
    }

    fn producer(&self, v: ValueId) -> Option<usize> {
        match self.g.values[v].kind {
            ValueKind::Computed { node, .. } if !self.dead[node] => Some(node),
            _ => None,
        }
    }

    fn replace_uses(&mut self, from: ValueId, to: ValueId) {
        for (i, n) in self.g.nodes.iter_mut().enumerate() {
            if !self.dead[i] {
                n.inputs
                    .iter_mut()
                    .filter(|v| **v == from)
                    .for_each(|v| *v = to);
            }
        }
    }

    fn constant(&self, v: ValueId) -> Option<Arc<Tensor>> {
        self.g.constant(v).cloned()
    }

    /// Node `keep` takes over `victim`'s output value (victim consumed keep's output).
    fn absorb(&mut self, keep: usize, victim: usize) {
        let out = self.g.nodes[victim].outputs[0];
        self.g.nodes[keep].outputs[0] = out;
        self.g.values[out].kind = ValueKind::Computed {
            node: keep,
            index: 0,
        };
        self.dead[victim] = true;
    }

    fn bypass_identities(&mut self) {
        for i in 0..self.g.nodes.len() {
            if self.dead[i] || self.g.nodes[i].op != Op::Identity {
                continue;
            }
            let (src, out) = (self.g.nodes[i].inputs[0], self.g.nodes[i].outputs[0]);
            if self.g.outputs.contains(&out) {
                continue;
            }
            self.replace_uses(out, src);
            self.dead[i] = true;
        }
    }

    /// Evaluates every node whose inputs are all constants, within [`MAX_FOLD_NODE_ELEMENTS`]
    /// a node and `budget` elements in all ([`fold_budget`]); a node past either stays a
    /// runtime node (the same result, computed per run, and counted by the footprint as an
    /// activation).
    fn fold_constants(&mut self, batch: usize, budget: u128) -> Result<()> {
        let mut budget = budget;
        for i in 0..self.g.nodes.len() {
            if self.dead[i] {
                continue;
            }
            let n = &self.g.nodes[i];
            let ins: Option<Vec<Arc<Tensor>>> =
                n.inputs.iter().map(|&v| self.constant(v)).collect();
            let Some(ins) = ins else { continue };
            let refs: Vec<&Tensor> = ins.iter().map(|t| t.as_ref()).collect();
            let cap = budget.min(MAX_FOLD_NODE_ELEMENTS);
            let Some(outs) = eval_node_within(n, &refs, batch, cap)? else {
                continue;
            };
            let made: u128 = outs.iter().map(|t| t.data.len() as u128).sum();
            budget = budget.saturating_sub(made);
            for (&o, t) in n.outputs.clone().iter().zip(outs) {
                self.g.values[o].kind = ValueKind::Constant(Arc::new(t));
            }
            self.dead[i] = true;
        }
        Ok(())
    }

    fn fold_batchnorm(&mut self) {
        let mut uses = self.uses();
        for bi in 0..self.g.nodes.len() {
            let Op::BatchNorm { eps } = self.g.nodes[bi].op else {
                continue;
            };
            if self.dead[bi] {
                continue;
            }
            let bn = self.g.nodes[bi].clone();
            let Some(pi) = self.producer(bn.inputs[0]) else {
                continue;
            };
            if self.sole_consumer(bn.inputs[0], &uses) != Some(bi) {
                continue;
            }
            let params: Option<Vec<Arc<Tensor>>> =
                bn.inputs[1..].iter().map(|&v| self.constant(v)).collect();
            let Some(params) = params else { continue };
            let prod = self.g.nodes[pi].clone();
            let foldable = match &prod.op {
                Op::Conv(a) => a.activation.is_none() && !a.residual,
                Op::Linear { activation } => activation.is_none(),
                _ => false,
            };
            if !foldable {
                continue;
            }
            let Some(w) = self.constant(prod.inputs[1]) else {
                continue;
            };
            let m = w.shape[0];
            if params.iter().any(|p| p.numel() != m) {
                continue;
            }
            // Linear's BN must normalise the last dim (BatchNorm1d on [N, C]): only 2-D.
            if matches!(prod.op, Op::Linear { .. })
                && self.shapes.get(bn.inputs[0]).map(|s| s.len()) != Some(2)
            {
                continue;
            }
            let b = match prod.inputs.get(2).map(|&v| self.constant(v)) {
                Some(Some(b)) => Some(b),
                Some(None) => continue,
                None => None,
            };
            let (gamma, beta, mean, var) = (
                &params[0].data,
                &params[1].data,
                &params[2].data,
                &params[3].data,
            );
            let per = w.numel() / m.max(1);
            let mut nw = w.as_ref().clone();
            let mut nb = vec![0.0f32; m];
            for c in 0..m {
                // Computed in f64 so the fold adds no more error than PyTorch's own BN.
                let s = gamma[c] as f64 / (var[c] as f64 + eps as f64).sqrt();
                for x in &mut nw.data[c * per..(c + 1) * per] {
                    *x = (*x as f64 * s) as f32;
                }
                let b0 = b.as_ref().map_or(0.0, |b| b.data[c] as f64);
                nb[c] = ((b0 - mean[c] as f64) * s + beta[c] as f64) as f32;
            }
            let wname = format!("{}.bnfold.weight", prod.name);
            let bname = format!("{}.bnfold.bias", prod.name);
            let wv = self.g.add_constant(wname, nw);
            let bv = self.g.add_constant(
                bname,
                Tensor {
                    shape: vec![m],
                    data: nb,
                },
            );
            uses.resize(self.g.values.len(), 0);
            let node = &mut self.g.nodes[pi];
            node.inputs[1] = wv;
            if node.inputs.len() >= 3 {
                node.inputs[2] = bv;
            } else {
                node.inputs.push(bv);
            }
            self.absorb(pi, bi);
        }
    }

    fn matmul_to_linear(&mut self) {
        for i in 0..self.g.nodes.len() {
            if self.dead[i] {
                continue;
            }
            let n = self.g.nodes[i].clone();
            let (w, bias) = match &n.op {
                Op::MatMul => {
                    let Some(w) = self.constant(n.inputs[1]) else {
                        continue;
                    };
                    if w.shape.len() != 2 {
                        continue;
                    }
                    (transpose2(&w), None)
                }
                Op::Gemm {
                    alpha,
                    beta,
                    trans_a: false,
                    trans_b,
                } if *alpha == 1.0 => {
                    let Some(w) = self.constant(n.inputs[1]) else {
                        continue;
                    };
                    let nout = if *trans_b { w.shape[0] } else { w.shape[1] };
                    let bias = match n.inputs.get(2) {
                        None => None,
                        Some(&c) => {
                            let Some(c) = self.constant(c) else { continue };
                            // Only a per-column bias ([N] or [1, N]) maps onto Linear's bias.
                            if c.numel() != nout || (c.shape.len() == 2 && c.shape[0] != 1) {
                                continue;
                            }
                            Some(Tensor {
                                shape: vec![nout],
                                data: c.data.iter().map(|v| v * beta).collect(),
                            })
                        }
                    };
                    (
                        if *trans_b {
                            w.as_ref().clone()
                        } else {
                            transpose2(&w)
                        },
                        bias,
                    )
                }
                _ => continue,
            };
            let wv = self.g.add_constant(format!("{}.linear.weight", n.name), w);
            let mut inputs = vec![n.inputs[0], wv];
            if let Some(b) = bias {
                inputs.push(self.g.add_constant(format!("{}.linear.bias", n.name), b));
            }
            self.g.nodes[i].op = Op::Linear { activation: None };
            self.g.nodes[i].inputs = inputs;
        }
        // A following `+ b` with a constant [N] bias becomes Linear's bias.
        let uses = self.uses();
        for i in 0..self.g.nodes.len() {
            if self.dead[i] || !matches!(self.g.nodes[i].op, Op::Linear { activation: None }) {
                continue;
            }
            if self.g.nodes[i].inputs.len() != 2 {
                continue;
            }
            let out = self.g.nodes[i].outputs[0];
            let Some(ai) = self.sole_consumer(out, &uses) else {
                continue;
            };
            let add = self.g.nodes[ai].clone();
            if add.op != Op::Binary(Binary::Add) {
                continue;
            }
            let other = if add.inputs[0] == out {
                add.inputs[1]
            } else {
                add.inputs[0]
            };
            let Some(b) = self.constant(other) else {
                continue;
            };
            let nout = self
                .constant(self.g.nodes[i].inputs[1])
                .map_or(0, |w| w.shape[0]);
            if b.numel() != nout || b.shape.iter().rev().skip(1).any(|&d| d != 1) {
                continue;
            }
            let bv = self.g.add_constant(
                format!("{}.linear.bias", self.g.nodes[i].name),
                Tensor {
                    shape: vec![nout],
                    data: b.data.clone(),
                },
            );
            self.g.nodes[i].inputs.push(bv);
            self.absorb(i, ai);
        }
    }

    fn fuse_silu(&mut self) {
        let uses = self.uses();
        for mi in 0..self.g.nodes.len() {
            if self.dead[mi] || self.g.nodes[mi].op != Op::Binary(Binary::Mul) {
                continue;
            }
            let mul = self.g.nodes[mi].clone();
            for (s, x) in [
                (mul.inputs[0], mul.inputs[1]),
                (mul.inputs[1], mul.inputs[0]),
            ] {
                let Some(si) = self.producer(s) else { continue };
                let sig = &self.g.nodes[si];
                if sig.op == Op::Unary(Unary::Sigmoid)
                    && sig.inputs[0] == x
                    && self.sole_consumer(s, &uses) == Some(mi)
                {
                    self.g.nodes[mi].op = Op::Unary(Unary::Silu);
                    self.g.nodes[mi].inputs = vec![x];
                    self.dead[si] = true;
                    break;
                }
            }
        }
    }

    /// The scalar value of a constant with one element.
    fn scalar(&self, v: ValueId) -> Option<f32> {
        let t = self.constant(v)?;
        (t.numel() == 1).then(|| t.data[0])
    }

    /// For a binary node with one scalar-constant operand: (other operand, scalar).
    fn with_scalar(&self, n: &Node) -> Option<(ValueId, f32)> {
        let (a, b) = (n.inputs[0], n.inputs[1]);
        match (self.scalar(a), self.scalar(b)) {
            (None, Some(s)) => Some((a, s)),
            (Some(s), None)
                if matches!(n.op, Op::Binary(Binary::Add) | Op::Binary(Binary::Mul)) =>
            {
                Some((b, s))
            }
            _ => None,
        }
    }

    /// `Mul(Mul(x, Add(Erf(Div(x, √2)), 1)), 0.5)` (PyTorch's exact-GELU ONNX export; the
    /// division may be a multiplication by 1/√2, and operands of Add/Mul in either order).
    fn fuse_gelu(&mut self) {
        let uses = self.uses();
        let close = |a: f32, b: f32| (a - b).abs() <= 1e-4 * b.abs();
        for ei in 0..self.g.nodes.len() {
            if self.dead[ei] || self.g.nodes[ei].op != Op::Unary(Unary::Erf) {
                continue;
            }
            let erf = self.g.nodes[ei].clone();
            let Some(di) = self.producer(erf.inputs[0]) else {
                continue;
            };
            let div = self.g.nodes[di].clone();
            let Some((x, s)) = self.with_scalar(&div) else {
                continue;
            };
            let scaled = match div.op {
                Op::Binary(Binary::Div) => close(s, std::f32::consts::SQRT_2),
                Op::Binary(Binary::Mul) => close(s, std::f32::consts::FRAC_1_SQRT_2),
                _ => false,
            };
            if !scaled || self.sole_consumer(div.outputs[0], &uses) != Some(ei) {
                continue;
            }
            let Some(ai) = self.sole_consumer(erf.outputs[0], &uses) else {
                continue;
            };
            let add = self.g.nodes[ai].clone();
            if add.op != Op::Binary(Binary::Add)
                || !matches!(self.with_scalar(&add), Some((_, one)) if one == 1.0)
            {
                continue;
            }
            let Some(mi) = self.sole_consumer(add.outputs[0], &uses) else {
                continue;
            };
            let mul = self.g.nodes[mi].clone();
            let other = if mul.inputs[0] == add.outputs[0] {
                mul.inputs[1]
            } else {
                mul.inputs[0]
            };
            if mul.op != Op::Binary(Binary::Mul) || other != x {
                continue;
            }
            let Some(hi) = self.sole_consumer(mul.outputs[0], &uses) else {
                continue;
            };
            let half = self.g.nodes[hi].clone();
            if half.op != Op::Binary(Binary::Mul)
                || !matches!(self.with_scalar(&half), Some((_, h)) if h == 0.5)
            {
                continue;
            }
            self.g.nodes[hi].op = Op::Unary(Unary::Gelu);
            self.g.nodes[hi].inputs = vec![x];
            for d in [di, ei, ai, mi] {
                self.dead[d] = true;
            }
        }
    }

    fn fuse_residual(&mut self) {
        let uses = self.uses();
        for ai in 0..self.g.nodes.len() {
            if self.dead[ai] || self.g.nodes[ai].op != Op::Binary(Binary::Add) {
                continue;
            }
            let add = self.g.nodes[ai].clone();
            for (c, r) in [
                (add.inputs[0], add.inputs[1]),
                (add.inputs[1], add.inputs[0]),
            ] {
                let Some(ci) = self.producer(c) else { continue };
                let Op::Conv(a) = &self.g.nodes[ci].op else {
                    continue;
                };
                if a.activation.is_some() || a.residual || self.sole_consumer(c, &uses) != Some(ai)
                {
                    continue;
                }
                // The residual must exist before the conv runs.
                let ready = match self.g.values[r].kind {
                    ValueKind::Computed { node, .. } => node < ci,
                    _ => true,
                };
                let same_shape = matches!((self.shapes.get(c), self.shapes.get(r)), (Some(a), Some(b)) if a == b);
                if !ready || c == r || !same_shape {
                    continue;
                }
                let conv = self.g.nodes[ci].clone();
                let attrs = ConvAttrs {
                    residual: true,
                    ..a.clone()
                };
                let mut inputs = conv.inputs.clone();
                if inputs.len() == 2 {
                    let m = self.constant(inputs[1]).map_or(0, |w| w.shape[0]);
                    if m == 0 {
                        continue;
                    }
                    inputs.push(
                        self.g.add_constant(
                            format!("{}.zero_bias", conv.name),
                            Tensor::zeros(vec![m]),
                        ),
                    );
                }
                inputs.push(r);
                self.g.nodes[ci].op = Op::Conv(attrs);
                self.g.nodes[ci].inputs = inputs;
                self.absorb(ci, ai);
                break;
            }
        }
    }

    fn fuse_activations(&mut self) {
        let uses = self.uses();
        for ui in 0..self.g.nodes.len() {
            if self.dead[ui] {
                continue;
            }
            let Op::Unary(u) = self.g.nodes[ui].op else {
                continue;
            };
            let fusable = matches!(
                u,
                Unary::Relu
                    | Unary::Relu6
                    | Unary::Clip { .. }
                    | Unary::Gelu
                    | Unary::GeluTanh
                    | Unary::Silu
                    | Unary::HardSwish
                    | Unary::HardSigmoid { .. }
                    | Unary::Sigmoid
                    | Unary::LeakyRelu { .. }
                    | Unary::Tanh
            );
            if !fusable {
                continue;
            }
            let x = self.g.nodes[ui].inputs[0];
            let Some(pi) = self.producer(x) else { continue };
            if self.sole_consumer(x, &uses) != Some(ui) {
                continue;
            }
            match &mut self.g.nodes[pi].op {
                Op::Conv(a) if a.activation.is_none() => a.activation = Some(u),
                Op::Linear { activation } if activation.is_none() => *activation = Some(u),
                _ => continue,
            }
            self.absorb(pi, ui);
        }
    }

    /// Dead-code elimination and renumbering of nodes and values.
    fn compact(self) -> Graph {
        let Rewriter { g, mut dead, .. } = self;
        // Live values: graph outputs and inputs of live nodes, walking backwards.
        let mut live_val = vec![false; g.values.len()];
        for &o in &g.outputs {
            live_val[o] = true;
        }
        for i in (0..g.nodes.len()).rev() {
            if dead[i] {
                continue;
            }
            if g.nodes[i].outputs.iter().any(|&o| live_val[o]) {
                for &v in &g.nodes[i].inputs {
                    live_val[v] = true;
                }
            } else {
                dead[i] = true;
            }
        }
        for &v in &g.inputs {
            live_val[v] = true;
        }
        let mut out = Graph::new(g.name.clone());
        let mut map: Vec<Option<ValueId>> = vec![None; g.values.len()];
        for &v in &g.inputs {
            if let ValueKind::Input(d) = &g.values[v].kind {
                map[v] = Some(out.add_input(g.values[v].name.clone(), d.clone()));
            }
        }
        for (v, val) in g.values.iter().enumerate() {
            if let ValueKind::Constant(t) = &val.kind {
                if live_val[v] {
                    map[v] = Some(out.add_shared_constant(val.name.clone(), t.clone()));
                }
            }
        }
        for (i, n) in g.nodes.iter().enumerate() {
            if dead[i] {
                continue;
            }
            let node_id = out.nodes.len();
            let inputs: Vec<ValueId> = n
                .inputs
                .iter()
                .map(|&v| map[v].unwrap_or(usize::MAX))
                .collect();
            let mut outs = Vec::new();
            for (k, &o) in n.outputs.iter().enumerate() {
                let id = out.values.len();
                out.values.push(crate::ir::Value {
                    name: g.values[o].name.clone(),
                    kind: ValueKind::Computed {
                        node: node_id,
                        index: k,
                    },
                    ty: g.values[o].ty.clone(),
                });
                map[o] = Some(id);
                outs.push(id);
            }
            out.nodes.push(Node {
                name: n.name.clone(),
                op: n.op.clone(),
                inputs,
                outputs: outs,
            });
        }
        out.outputs = g
            .outputs
            .iter()
            .map(|&o| map[o].unwrap_or(usize::MAX))
            .collect();
        out
    }
}

pub(crate) fn transpose2(w: &Tensor) -> Tensor {
    let (r, c) = (w.shape[0], w.shape[1]);
    let mut d = vec![0.0; r * c];
    for i in 0..r {
        for j in 0..c {
            d[j * r + i] = w.data[i * c + j];
        }
    }
    Tensor {
        shape: vec![c, r],
        data: d,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Dim;

    /// `x + e0 + e1 + ...`, each `ei` an Expand of a one-element constant to `[1, 1024]`.
    fn expanded_constants(n: usize) -> Graph {
        let mut g = Graph::new("g");
        let mut last = g.add_input("x", vec![Dim::Batch, Dim::Fixed(1024)]);
        for i in 0..n {
            let c = g.add_constant(format!("c{i}"), Tensor::scalar(i as f32));
            let shape = vec![Dim::Fixed(1), Dim::Fixed(1024)];
            let e = g
                .add_op(format!("e{i}"), Op::Expand { shape }, &[c])
                .unwrap();
            last = g
                .add_op(format!("add{i}"), Op::Binary(Binary::Add), &[last, e])
                .unwrap();
        }
        g.add_output(last).unwrap();
        g
    }

    /// Folding stops where the graph's budget is spent: the rest stay runtime nodes, with the
    /// same results.
    #[test]
    fn constant_folding_stops_at_its_budget_and_keeps_the_results() {
        let g = expanded_constants(5);
        let expands = |g: &Graph| g.nodes.iter().filter(|n| n.op.name() == "Expand").count();
        let fold = |budget: u128| {
            let mut p = Rewriter {
                dead: vec![false; g.nodes.len()],
                shapes: g.infer_shapes(2).unwrap(),
                g: g.clone(),
            };
            p.fold_constants(2, budget).unwrap();
            p.compact()
        };
        assert_eq!(expands(&fold(u128::MAX)), 0);
        // 3 × 1024 elements fit 3.5 × 1024; the last two Expands stay.
        let partly = fold(3 * 1024 + 512);
        assert_eq!(expands(&partly), 2);
        let x = Tensor::new(vec![2, 1024], (0..2048).map(|i| i as f32).collect()).unwrap();
        let want = crate::reference::interpret(&g, 2, std::slice::from_ref(&x)).unwrap();
        let got = crate::reference::interpret(&partly, 2, &[x]).unwrap();
        assert_eq!(want, got);
        // The default budget folds them all.
        assert_eq!(expands(&optimize(&g, 2).unwrap()), 0);
    }
}
