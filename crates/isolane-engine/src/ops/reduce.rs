//! Reductions over axes: `Op::Reduce` (Mean, Sum, Max, Min, L1, SumSquare, L2) and
//! `Op::Softmax`.
//!
//! ONNX: the Reduce op types and Softmax (before opset 13 over the input coerced to 2-D).

use crate::error::Result;
use crate::ir::{norm_axis, shape_err, Node, ReduceKind};
use crate::ir::{Dim, Op};
use crate::kernels::{strides_of, unsupported, Kernel};
use crate::onnx::fold::{Arr, Sym};
use crate::onnx::import::{fmt_syms, node_axis, sym_to_dim, Ctx, Importer, Val};
use crate::onnx::Result as OnnxResult;
use crate::ops::ImportFn;

/// The shape rule of `Op::Softmax { axis }`: the input's shape, once the axis is in range.
pub(crate) fn infer_softmax(n: &Node, x: &[usize], axis: i64) -> Result<Vec<usize>> {
    norm_axis(axis, x.len())
        .ok_or_else(|| shape_err(n, format!("axis {axis} out of range for {x:?}")))?;
    Ok(x.to_vec())
}

/// The shape rule of `Op::Reduce { axes, keepdims, .. }`.
pub(crate) fn infer_reduce(
    n: &Node,
    ins: &[&[usize]],
    axes: &[i64],
    keepdims: &bool,
) -> Result<Vec<usize>> {
    let err = |m: String| shape_err(n, m);
    let x = ins.first().copied().unwrap_or(&[]);
    let shape = {
        let mut red = vec![axes.is_empty(); x.len()];
        for &a in axes {
            red[norm_axis(a, x.len()).ok_or_else(|| err(format!("axis {a} out of range")))?] = true;
        }
        let mut o = Vec::new();
        for (i, &d) in x.iter().enumerate() {
            if !red[i] {
                o.push(d);
            } else if *keepdims {
                o.push(1);
            }
        }
        o
    };
    Ok(shape)
}

/// The CPU kernel of `Op::Softmax { axis }`.
pub(crate) fn prepare_softmax(node: &Node, x: &[usize], axis: i64) -> Result<Kernel> {
    let a = norm_axis(axis, x.len()).ok_or_else(|| unsupported(node, "axis"))?;
    Ok(Kernel::Softmax {
        outer: x[..a].iter().product(),
        dim: x[a],
        inner: x[a + 1..].iter().product(),
    })
}

/// The CPU kernel of `Op::Reduce { kind, axes, .. }`.
pub(crate) fn prepare_reduce(
    node: &Node,
    ins: &[&[usize]],
    kind: &ReduceKind,
    axes: &[i64],
) -> Result<Kernel> {
    let x = ins[0];
    let kernel = {
        let mut red = vec![axes.is_empty(); x.len()];
        for &ax in axes {
            red[norm_axis(ax, x.len()).ok_or_else(|| unsupported(node, "axis"))?] = true;
        }
        let st = strides_of(x);
        let offs = |sel: bool| -> Vec<usize> {
            let dims: Vec<usize> = (0..x.len()).filter(|&i| red[i] == sel).collect();
            let total: usize = dims.iter().map(|&i| x[i]).product();
            let mut v = Vec::with_capacity(total);
            let mut idx = vec![0usize; dims.len()];
            for _ in 0..total {
                v.push(idx.iter().zip(&dims).map(|(i, &d)| i * st[d]).sum());
                for j in (0..idx.len()).rev() {
                    idx[j] += 1;
                    if idx[j] < x[dims[j]] {
                        break;
                    }
                    idx[j] = 0;
                }
            }
            v
        };
        Kernel::Reduce {
            kind: *kind,
            bases: offs(false),
            offsets: offs(true),
        }
    };
    Ok(kernel)
}

/// The ONNX op types imported as reductions.
pub(crate) const ONNX: &[(&str, ImportFn)] = &[
    ("ReduceMean", import_reduce),
    ("ReduceSum", import_reduce),
    ("ReduceMax", import_reduce),
    ("ReduceMin", import_reduce),
    ("ReduceL2", import_reduce),
    ("ReduceL1", import_reduce),
    ("ReduceSumSquare", import_reduce),
    ("Softmax", import_softmax),
];

fn import_reduce(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    im.reduce(c, c.op())
}

/// Softmax before opset 13 coerces its input to 2-D around the axis.
fn import_softmax(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    if im.m.opset < 13 {
        return im.softmax_v1(c);
    }
    let axis = c.int("axis", -1)?;
    let x = im.req(c, 0)?;
    node_axis(c, axis, x.rank())?;
    im.emit1(c, Op::Softmax { axis }, 1)
}

/// ReduceSum, ReduceMax or ReduceMin of integers known at import (BEiT's relative position
/// index sums coordinate pairs: `relative_coords.sum(-1)`). The IR computes in f32 only, so an
/// integer reduction is done here or refused by name.
fn reduce_ints(
    c: &Ctx,
    op: &str,
    a: &Arr<Sym>,
    axes: &[i64],
    keepdims: bool,
) -> OnnxResult<Arr<Sym>> {
    let step: fn(Sym, Sym) -> std::result::Result<Sym, String> = match op {
        "ReduceSum" => Sym::add,
        "ReduceMax" => Sym::max,
        "ReduceMin" => Sym::min,
        _ => {
            return Err(c.bad(format!(
                "{op} of integers known at import is not supported (ReduceSum, ReduceMax and \
                 ReduceMin are; isolane computes runtime tensors in float32 only)"
            )))
        }
    };
    let rank = a.shape.len();
    let mut reduced = vec![false; rank];
    for &ax in axes {
        reduced[node_axis(c, ax, rank)?] = true;
    }
    let kept: Vec<usize> = (0..rank)
        .map(|d| if reduced[d] { 1 } else { a.shape[d] })
        .collect();
    let mut acc: Vec<Option<Sym>> = vec![None; kept.iter().product()];
    let mut coord = vec![0usize; rank];
    for &v in &a.data {
        let mut at = 0usize;
        for d in 0..rank {
            at = at * kept[d] + if reduced[d] { 0 } else { coord[d] };
        }
        acc[at] = Some(match acc[at] {
            None => v,
            Some(p) => step(p, v).map_err(|e| c.bad(e))?,
        });
        for d in (0..rank).rev() {
            coord[d] += 1;
            if coord[d] < a.shape[d] {
                break;
            }
            coord[d] = 0;
        }
    }
    // An empty reduction: the sum is 0; a max or min of nothing is not defined.
    let data = acc
        .into_iter()
        .map(|v| match (v, op) {
            (Some(v), _) => Ok(v),
            (None, "ReduceSum") => Ok(Sym::k(0)),
            (None, _) => Err(c.bad(format!("{op} over an empty axis"))),
        })
        .collect::<OnnxResult<Vec<_>>>()?;
    let shape = if keepdims {
        kept
    } else {
        (0..rank)
            .filter(|&d| !reduced[d])
            .map(|d| a.shape[d])
            .collect()
    };
    Ok(Arr::new(shape, data))
}

impl Importer<'_> {
    /// The Reduce ops (F.normalize writes ReduceL2); each is one `Op::Reduce` of its kind
    /// ([`ReduceKind`] says why L1/L2/SumSquare are not split into steps).
    pub(crate) fn reduce(&mut self, c: &Ctx, op: &str) -> OnnxResult<Vec<Val>> {
        // Axes moved from an attribute to an input: ReduceSum at opset 13, the others at 18.
        let axes_as_input = (op == "ReduceSum" && self.m.opset >= 13) || self.m.opset >= 18;
        let axes = if axes_as_input {
            self.ints_input(c, 1, "axes")?
        } else {
            c.ints("axes")?
        };
        let keepdims = c.int("keepdims", 1)? != 0;
        let noop = c.int("noop_with_empty_axes", 0)? != 0;
        let axes = axes.unwrap_or_default();
        if axes.is_empty() && noop {
            if !matches!(op, "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin") {
                return Err(c.unsupported_attr(
                    "noop_with_empty_axes",
                    format!("value 1 with no axes on {op}"),
                ));
            }
            return Ok(vec![self.req(c, 0)?]);
        }
        let x = self.req(c, 0)?;
        for &a in &axes {
            node_axis(c, a, x.rank())?;
        }
        let axes = if axes.is_empty() {
            (0..x.rank() as i64).collect()
        } else {
            axes
        };
        if let Val::I(a) = &x {
            return Ok(vec![Val::I(reduce_ints(c, op, a, &axes, keepdims)?)]);
        }
        let kind = match op {
            "ReduceMean" => ReduceKind::Mean,
            "ReduceMax" => ReduceKind::Max,
            "ReduceMin" => ReduceKind::Min,
            "ReduceL1" => ReduceKind::L1,
            "ReduceL2" => ReduceKind::L2,
            "ReduceSumSquare" => ReduceKind::SumSquare,
            _ => ReduceKind::Sum,
        };
        let reduce = Op::Reduce {
            kind,
            axes,
            keepdims,
        };
        self.emit1(c, reduce, 1)
    }

    /// Softmax before opset 13 (default axis 1): the input is coerced to 2-D, `[d0·…·d(axis−1),
    /// d(axis)·…·d(n−1)]`, each row normalised as one, and the result reshaped back. Over the
    /// last axis this is the newer Softmax; over an earlier one it normalises several axes
    /// together (unlike opset 13's single axis), imported as Flatten → Softmax → Reshape.
    pub(crate) fn softmax_v1(&mut self, c: &Ctx) -> OnnxResult<Vec<Val>> {
        let axis = c.int("axis", 1)?;
        let x = self.req(c, 0)?;
        let r = x.rank();
        // Flatten's axis may equal the rank: every row then holds one element.
        let a = if axis == r as i64 {
            r
        } else {
            node_axis(c, axis, r)?
        };
        if a + 1 == r {
            return self.emit1(c, Op::Softmax { axis: -1 }, 1);
        }
        let shape = x.sym_shape().map_err(|e| c.bad(e))?;
        let back: Vec<Dim> = shape
            .iter()
            .map(|&s| sym_to_dim(s, false))
            .collect::<OnnxResult<_, _>>()
            .map_err(|e| c.bad(format!("shape {}: {e}", fmt_syms(&shape))))?;
        let flat = self.emit_tmp(
            c,
            Op::Flatten { axis: a as i64 },
            &[(c.n.input[0].clone(), x)],
            "rows",
        )?;
        let soft = self.emit_tmp(
            c,
            Op::Softmax { axis: -1 },
            &[(format!("{}:rows", c.r.node), flat)],
            "normalised",
        )?;
        let out = self.out_name(c, 0);
        self.emit(
            c,
            Op::Reshape { shape: back },
            &[(format!("{}:normalised", c.r.node), soft)],
            vec![out],
        )
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::testing::{ints, node, run, with_int};

    /// BEiT's `relative_coords.sum(-1)`: a ReduceSum of integers known at import, which was
    /// emitted as a runtime node and refused ("an integer constant used as a runtime tensor").
    #[test]
    fn integer_reductions_known_at_import_are_computed() {
        let x: Vec<f32> = (0..4).map(|v| v as f32 * 10.0).collect();
        for (op, want) in [("ReduceSum", [30.0, 0.0]), ("ReduceMax", [20.0, 0.0])] {
            let reduce = if op == "ReduceSum" {
                node(op, &["data", "axes"], "idx")
            } else {
                let mut n = node(op, &["data"], "idx");
                n.attribute.push(crate::onnx::proto::AttributeProto {
                    name: Some("axes".into()),
                    ints: vec![-1],
                    r#type: Some(crate::onnx::proto::attribute_proto::AttributeType::Ints as i32),
                    ..Default::default()
                });
                n
            };
            let nodes = vec![
                with_int(reduce, "keepdims", 0),
                with_int(node("Gather", &["x", "idx"], "y"), "axis", 1),
            ];
            let inits = vec![
                ints("data", &[2, 2], &[1, 2, 0, 0]),
                ints("axes", &[1], &[-1]),
            ];
            let y = run(nodes, inits, &[1, 4], &x).unwrap();
            assert_eq!(y.data, want, "{op}");
        }
        let nodes = vec![
            node("ReduceMean", &["data"], "idx"),
            with_int(node("Gather", &["x", "idx"], "y"), "axis", 1),
        ];
        let e = run(nodes, vec![ints("data", &[2], &[1, 2])], &[1, 4], &x).unwrap_err();
        assert!(e.contains("ReduceMean of integers"), "{e}");
    }
}
