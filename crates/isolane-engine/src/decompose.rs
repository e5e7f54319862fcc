//! Rewrites the general forms of two ONNX ops into ops every backend lowers, before the other
//! passes run:
//!
//! - a `Gemm` (`alpha * op(A) @ op(B) + beta * C`) becomes `Transpose`, `MatMul`, `Mul` and
//!   `Add`, with the transposes and scales of constants folded into the constants. The common
//!   form (constant B, per-column C) then still becomes one `Linear` with its bias
//!   (`passes::matmul_to_linear`); what a backend had no kernel for (a transposed or computed A,
//!   a computed B, a C of full shape) now runs as the products and broadcasts it has.
//! - a `Slice` with a negative step on an axis that does not scale with the batch becomes a
//!   `Slice` of its positive steps (if any) followed by one `Gather` of constant indices per
//!   reversed axis: a Gather is a copy per index, which every backend has. A reversed batch axis
//!   is left alone (its indices would depend on the batch), and so is an axis longer than
//!   [`MAX_REVERSED_LEN`] (its indices would be a large allocation of their own).
//!
//! Values keep their names: the last node of a rewrite writes the original output value, so
//! graph outputs, probes and check reports name what the model named.

use crate::ir::{slice_params, Binary, Graph, Node, Op, Tensor, ValueId, ValueKind};
use crate::passes::transpose2 as transposed;
use crate::Result;
use std::sync::Arc;

/// The longest axis a reversing Slice is rewritten along: its Gather holds one i64 index per
/// element (8 MiB here). Any real model's reversed axis (an image side, a sequence) is far
/// shorter; a longer one keeps its Slice, which the CPU backend runs and the others refuse by
/// name, rather than building the indices of an axis that a file merely claims.
pub const MAX_REVERSED_LEN: usize = 1 << 20;

/// `g` with its general Gemms and reversing Slices rewritten (see the module's documentation);
/// `g` itself (cloned) when it has none. `batch` resolves the Slices' bounds.
pub fn general_forms(g: &Graph, batch: usize) -> Result<Graph> {
    if !g.nodes.iter().any(|n| match &n.op {
        Op::Gemm { .. } => true,
        Op::Slice { steps, .. } => steps.iter().any(|&s| s < 0),
        _ => false,
    }) {
        return Ok(g.clone());
    }
    let shapes = g.infer_shapes(batch)?;
    // A dim that differs at another batch scales with it: a Gather along it cannot be fixed.
    // (A graph that only takes this batch has no other: its reversing Slices are left alone.)
    let other = g.infer_shapes(batch + 1).ok();
    let wanted: Vec<bool> = g
        .nodes
        .iter()
        .map(|n| match &n.op {
            Op::Gemm { .. } => true,
            Op::Slice { .. } => other
                .as_deref()
                .and_then(|o| reversed_axes(n, &shapes, o))
                .is_some_and(|r| !r.is_empty()),
            _ => false,
        })
        .collect();
    if !wanted.iter().any(|&w| w) {
        return Ok(g.clone());
    }
    let mut b = Builder {
        out: Graph::new(g.name.clone()),
        map: vec![None; g.values.len()],
    };
    for &v in &g.inputs {
        if let ValueKind::Input(d) = &g.values[v].kind {
            b.map[v] = Some(b.out.add_input(g.values[v].name.clone(), d.clone()));
        }
    }
    for (v, val) in g.values.iter().enumerate() {
        if let ValueKind::Constant(t) = &val.kind {
            b.map[v] = Some(b.out.add_shared_constant(val.name.clone(), t.clone()));
        }
    }
    for (i, n) in g.nodes.iter().enumerate() {
        if !wanted[i] {
            b.copy(g, n)?;
            continue;
        }
        match &n.op {
            Op::Gemm {
                alpha,
                beta,
                trans_a,
                trans_b,
            } => b.gemm(g, n, *alpha, *beta, *trans_a, *trans_b)?,
            Op::Slice {
                starts,
                ends,
                axes,
                steps,
            } => b.slice(g, n, &shapes[n.inputs[0]], [starts, ends, axes, steps])?,
            _ => unreachable!("only Gemm and Slice are wanted"),
        }
    }
    b.out.outputs = g.outputs.iter().map(|&o| b.id(o)).collect();
    b.out.validate()?;
    Ok(b.out)
}

/// The axes of a Slice node walked backwards (negative step); `None` when the node is to be
/// left as it is: one of them changes size with the batch, selects nothing or more than
/// [`MAX_REVERSED_LEN`] elements, or the Slice is malformed (its own lowering then says why).
fn reversed_axes(n: &Node, shapes: &[Vec<usize>], other: &[Vec<usize>]) -> Option<Vec<usize>> {
    let Op::Slice {
        starts,
        ends,
        axes,
        steps,
    } = &n.op
    else {
        return None;
    };
    let x = &shapes[n.inputs[0]];
    let resolved = slice_params(x, starts, ends, axes, steps).ok()?;
    let mut out = Vec::new();
    for (i, &s) in steps.iter().enumerate() {
        if s >= 0 {
            continue;
        }
        let ax = axes.get(i).copied().unwrap_or(i as i64);
        let a = if ax < 0 { ax + x.len() as i64 } else { ax };
        let a = usize::try_from(a).ok().filter(|&a| a < x.len())?;
        let len = resolved[a].2;
        if other[n.inputs[0]].get(a) != Some(&x[a]) || len == 0 || len > MAX_REVERSED_LEN {
            return None;
        }
        out.push(a);
    }
    Some(out)
}

struct Builder {
    out: Graph,
    /// The new id of each old value, once made.
    map: Vec<Option<ValueId>>,
}

impl Builder {
    fn id(&self, v: ValueId) -> ValueId {
        // Inputs, constants and earlier nodes' outputs are all mapped before a node reads
        // them (the old graph is in topological order); validate() catches anything else.
        self.map[v].unwrap_or(usize::MAX)
    }

    fn constant(&self, g: &Graph, v: ValueId) -> Option<Arc<Tensor>> {
        g.constant(v).cloned()
    }

    fn copy(&mut self, g: &Graph, n: &Node) -> Result<()> {
        let inputs: Vec<ValueId> = n.inputs.iter().map(|&v| self.id(v)).collect();
        let names = n
            .outputs
            .iter()
            .map(|&o| g.values[o].name.clone())
            .collect();
        let outs = self
            .out
            .add_node_with_outputs(n.name.clone(), n.op.clone(), &inputs, names)?;
        for (&o, new) in n.outputs.iter().zip(outs) {
            self.map[o] = Some(new);
        }
        Ok(())
    }

    /// A node of the rewrite; the last one of a rewrite passes `last = Some(old output)`.
    fn op(
        &mut self,
        g: &Graph,
        n: &Node,
        step: &str,
        op: Op,
        inputs: &[ValueId],
        last: bool,
    ) -> Result<ValueId> {
        let o = n.outputs[0];
        let name = if last {
            g.values[o].name.clone()
        } else {
            format!("{}.{step}", n.name)
        };
        let v =
            self.out
                .add_node_with_outputs(format!("{}.{step}", n.name), op, inputs, vec![name])?[0];
        if last {
            self.map[o] = Some(v);
        }
        Ok(v)
    }

    fn gemm(
        &mut self,
        g: &Graph,
        n: &Node,
        alpha: f32,
        beta: f32,
        trans_a: bool,
        trans_b: bool,
    ) -> Result<()> {
        let const_a = self.constant(g, n.inputs[0]);
        let const_b = self.constant(g, n.inputs[1]);
        let c = n.inputs.get(2).copied().filter(|_| beta != 0.0);
        let a = match (trans_a, &const_a) {
            (false, _) => self.id(n.inputs[0]),
            (true, Some(t)) if t.shape.len() == 2 => self
                .out
                .add_constant(format!("{}.a_t", n.name), transposed(t)),
            (true, _) => {
                let x = self.id(n.inputs[0]);
                self.op(
                    g,
                    n,
                    "transpose_a",
                    Op::Transpose { perm: vec![1, 0] },
                    &[x],
                    false,
                )?
            }
        };
        // alpha rides on a constant B when there is one; otherwise on the product.
        let mut scale_product = alpha != 1.0;
        let b = match &const_b {
            Some(t) if t.shape.len() == 2 && (trans_b || alpha != 1.0) => {
                let mut w = if trans_b {
                    transposed(t)
                } else {
                    t.as_ref().clone()
                };
                if alpha != 1.0 {
                    w.data.iter_mut().for_each(|x| *x *= alpha);
                    scale_product = false;
                }
                self.out.add_constant(format!("{}.b", n.name), w)
            }
            _ if trans_b => {
                let x = self.id(n.inputs[1]);
                self.op(
                    g,
                    n,
                    "transpose_b",
                    Op::Transpose { perm: vec![1, 0] },
                    &[x],
                    false,
                )?
            }
            _ => self.id(n.inputs[1]),
        };
        let done_after_product = !scale_product && c.is_none();
        let mut y = self.op(g, n, "matmul", Op::MatMul, &[a, b], done_after_product)?;
        if scale_product {
            let s = self
                .out
                .add_constant(format!("{}.alpha", n.name), Tensor::scalar(alpha));
            y = self.op(g, n, "alpha", Op::Binary(Binary::Mul), &[y, s], c.is_none())?;
        }
        if let Some(c) = c {
            let cv = match self.constant(g, c) {
                Some(t) if beta != 1.0 => {
                    let mut t = t.as_ref().clone();
                    t.data.iter_mut().for_each(|x| *x *= beta);
                    self.out.add_constant(format!("{}.c", n.name), t)
                }
                _ if beta != 1.0 => {
                    let s = self
                        .out
                        .add_constant(format!("{}.beta", n.name), Tensor::scalar(beta));
                    let x = self.id(c);
                    self.op(g, n, "beta", Op::Binary(Binary::Mul), &[x, s], false)?
                }
                _ => self.id(c),
            };
            self.op(g, n, "add_c", Op::Binary(Binary::Add), &[y, cv], true)?;
        }
        Ok(())
    }

    fn slice(
        &mut self,
        g: &Graph,
        n: &Node,
        x: &[usize],
        [starts, ends, axes, steps]: [&Vec<i64>; 4],
    ) -> Result<()> {
        let err = |e: String| crate::EngineError::graph(&n.name, e);
        let resolved = slice_params(x, starts, ends, axes, steps).map_err(err)?;
        let all_axes: Vec<i64> = if axes.is_empty() {
            (0..starts.len() as i64).collect()
        } else {
            axes.clone()
        };
        let keep: Vec<usize> = (0..starts.len()).filter(|&i| steps[i] > 0).collect();
        let reversed: Vec<usize> = (0..starts.len())
            .filter(|&i| steps[i] < 0)
            .map(|i| {
                let a = all_axes[i];
                (if a < 0 { a + x.len() as i64 } else { a }) as usize
            })
            .collect();
        let mut v = self.id(n.inputs[0]);
        if !keep.is_empty() {
            let pick = |s: &Vec<i64>| keep.iter().map(|&i| s[i]).collect::<Vec<_>>();
            let op = Op::Slice {
                starts: pick(starts),
                ends: pick(ends),
                axes: pick(&all_axes),
                steps: pick(steps),
            };
            v = self.op(g, n, "slice", op, &[v], false)?;
        }
        for (k, &a) in reversed.iter().enumerate() {
            let (start, step, len) = resolved[a];
            let indices: Vec<i64> = (0..len as i64).map(|j| start + j * step).collect();
            let op = Op::Gather {
                axis: a as i64,
                indices,
                indices_shape: vec![len],
            };
            v = self.op(
                g,
                n,
                &format!("reverse{a}"),
                op,
                &[v],
                k + 1 == reversed.len(),
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Dim;
    use crate::reference::interpret;

    fn seeded(shape: Vec<usize>, seed: u32) -> Tensor {
        let n = shape.iter().product::<usize>();
        let data = (0..n)
            .map(|i| (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        Tensor { shape, data }
    }

    /// `g` and its rewrite compute the same values on one seeded input.
    fn same_values(g: &Graph, batch: usize) -> Graph {
        let d = general_forms(g, batch).unwrap();
        let shapes = g.infer_shapes(batch).unwrap();
        let x: Vec<Tensor> = g
            .inputs
            .iter()
            .map(|&v| seeded(shapes[v].clone(), v as u32 + 7))
            .collect();
        let want = interpret(g, batch, &x).unwrap();
        let got = interpret(&d, batch, &x).unwrap();
        assert_eq!(want.len(), got.len());
        for (w, o) in want.iter().zip(&got) {
            assert_eq!(w.shape, o.shape);
            for (a, b) in w.data.iter().zip(&o.data) {
                assert!((a - b).abs() <= 1e-5 * (1.0 + a.abs()), "{a} against {b}");
            }
        }
        let names = |g: &Graph| -> Vec<String> {
            g.outputs
                .iter()
                .map(|&o| g.values[o].name.clone())
                .collect()
        };
        assert_eq!(names(g), names(&d), "the outputs keep their names");
        d
    }

    fn ops(g: &Graph) -> Vec<&'static str> {
        g.nodes.iter().map(|n| n.op.name()).collect()
    }

    fn gemm_graph(
        trans_a: bool,
        trans_b: bool,
        alpha: f32,
        beta: f32,
        c: Option<bool>,
        b_const: bool,
    ) -> Graph {
        // A is [batch, 6] (computed: a Relu of the input), or its transpose [6, batch].
        let mut g = Graph::new("gemm");
        let x = g.add_input("x", vec![Dim::Fixed(6), Dim::Fixed(5)]);
        let a = g
            .add_op("relu", Op::Unary(crate::ir::Unary::Relu), &[x])
            .unwrap();
        let k = if trans_a { 6 } else { 5 };
        let b_shape = if trans_b { vec![4, k] } else { vec![k, 4] };
        let b = if b_const {
            g.add_constant("b", seeded(b_shape, 3))
        } else {
            let y = g.add_input("y", b_shape.into_iter().map(Dim::Fixed).collect());
            g.add_op("neg", Op::Unary(crate::ir::Unary::Neg), &[y])
                .unwrap()
        };
        let mut inputs = vec![a, b];
        match c {
            Some(true) => {
                inputs.push(g.add_constant("c", seeded(vec![if trans_a { 5 } else { 6 }, 4], 5)))
            }
            Some(false) => inputs.push(g.add_input("c", vec![Dim::Fixed(4)])),
            None => {}
        }
        let y = g
            .add_op(
                "gemm",
                Op::Gemm {
                    alpha,
                    beta,
                    trans_a,
                    trans_b,
                },
                &inputs,
            )
            .unwrap();
        g.add_output(y).unwrap();
        g
    }

    #[test]
    fn every_gemm_form_becomes_products_of_the_same_value() {
        for trans_a in [false, true] {
            for trans_b in [false, true] {
                for (alpha, beta) in [(1.0, 1.0), (0.5, 2.0), (1.0, 0.0)] {
                    for c in [None, Some(true), Some(false)] {
                        for b_const in [true, false] {
                            let g = gemm_graph(trans_a, trans_b, alpha, beta, c, b_const);
                            let d = same_values(&g, 1);
                            assert!(!ops(&d).contains(&"Gemm"), "{:?}", ops(&d));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_plain_gemm_of_constants_still_becomes_one_linear() {
        // transB with a per-column bias: torch's Linear as exported, the form every model has.
        let mut g = Graph::new("linear");
        let x = g.add_input("x", vec![Dim::Batch, Dim::Fixed(8)]);
        let w = g.add_constant("w", seeded(vec![3, 8], 1));
        let b = g.add_constant("bias", seeded(vec![3], 2));
        let gemm = Op::Gemm {
            alpha: 1.0,
            beta: 1.0,
            trans_a: false,
            trans_b: true,
        };
        let y = g.add_op("fc", gemm, &[x, w, b]).unwrap();
        g.add_output(y).unwrap();
        same_values(&g, 2);
        let opt = crate::passes::optimize(&g, 2).unwrap();
        assert_eq!(ops(&opt), ["Linear"]);
    }

    #[test]
    fn a_reversing_slice_becomes_gathers_and_a_reversed_batch_axis_stays() {
        let mut g = Graph::new("flip");
        let x = g.add_input("x", vec![Dim::Batch, Dim::Fixed(3), Dim::Fixed(7)]);
        let flip = Op::Slice {
            starts: vec![-1, 6, 0],
            ends: vec![i64::MIN, 0, 1],
            axes: vec![1, 2, 0],
            steps: vec![-1, -2, 1],
        };
        let y = g.add_op("flip", flip, &[x]).unwrap();
        g.add_output(y).unwrap();
        let d = same_values(&g, 2);
        assert_eq!(ops(&d), ["Slice", "Gather", "Gather"]);

        assert_eq!(
            ops(&general_forms(&flip_one_axis(3, 0), 2).unwrap()),
            ["Slice"]
        );
    }

    /// A graph reversing axis `axis` of an input `[batch, len]`.
    fn flip_one_axis(len: usize, axis: i64) -> Graph {
        let mut g = Graph::new("flip_one_axis");
        let x = g.add_input("x", vec![Dim::Batch, Dim::Fixed(len)]);
        let flip = Op::Slice {
            starts: vec![-1],
            ends: vec![i64::MIN],
            axes: vec![axis],
            steps: vec![-1],
        };
        let y = g.add_op("flip", flip, &[x]).unwrap();
        g.add_output(y).unwrap();
        g
    }

    /// Found by the footprint fuzz target: a file claiming a 2^31-long axis made the rewrite
    /// build 2^31 indices (16 GiB) before anything checked the model's size. Past the cap the
    /// Slice stays as it is; at the cap it still becomes a Gather.
    #[test]
    fn a_reversed_axis_past_the_cap_keeps_its_slice() {
        let flip = |len: usize| ops(&general_forms(&flip_one_axis(len, 1), 1).unwrap());
        assert_eq!(flip(1 << 31), ["Slice"]);
        assert_eq!(flip(MAX_REVERSED_LEN + 1), ["Slice"]);
        assert_eq!(flip(MAX_REVERSED_LEN), ["Gather"]);
    }
}
