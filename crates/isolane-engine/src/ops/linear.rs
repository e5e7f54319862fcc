//! Matrix products: `Op::MatMul` (numpy semantics), `Op::Gemm` (ONNX) and `Op::Linear`
//! (PyTorch's `nn.Linear`, which the passes make of the other two when the weight is constant).
//!
//! ONNX: Gemm, MatMul (small products of constants computed at import) and Einsum (the
//! batched-matrix-product equations, as Transpose → MatMul → Transpose).

use crate::error::Result;
use crate::ir::{broadcast_shapes, matmul_shape, shape_err, Node, Unary};
use crate::kernels::{bcast_strides, unsupported, Kernel, MatMulK};
use std::collections::HashSet;

use crate::ir::Op;
use crate::onnx::fold::{self, Arr};
use crate::onnx::import::{batch_uniform, Ctx, Importer, Val};
use crate::onnx::Result as OnnxResult;
use crate::ops::ImportFn;

/// The shape rule of `Op::MatMul`.
pub(crate) fn infer_matmul(n: &Node, ins: &[&[usize]]) -> Result<Vec<usize>> {
    matmul_shape(ins[0], ins[1]).map_err(|m| shape_err(n, m))
}

/// The shape rule of `Op::Gemm { trans_a, trans_b, .. }`.
pub(crate) fn infer_gemm(
    n: &Node,
    ins: &[&[usize]],
    trans_a: &bool,
    trans_b: &bool,
) -> Result<Vec<usize>> {
    let err = |m: String| shape_err(n, m);
    let shape = {
        let (a, b) = (ins[0], ins[1]);
        if a.len() != 2 || b.len() != 2 {
            return Err(err(format!("Gemm needs 2-D inputs, got {a:?}, {b:?}")));
        }
        let (m, k) = if *trans_a { (a[1], a[0]) } else { (a[0], a[1]) };
        let (k2, nn) = if *trans_b { (b[1], b[0]) } else { (b[0], b[1]) };
        if k != k2 {
            return Err(err(format!("inner dims differ: {a:?} x {b:?}")));
        }
        if ins.len() == 3 && broadcast_shapes(ins[2], &[m, nn]).as_deref() != Some(&[m, nn][..]) {
            return Err(err(format!(
                "C {:?} does not broadcast to [{m}, {nn}]",
                ins[2]
            )));
        }
        vec![m, nn]
    };
    Ok(shape)
}

/// The shape rule of `Op::Linear { .. }`.
pub(crate) fn infer_linear(n: &Node, ins: &[&[usize]]) -> Result<Vec<usize>> {
    let err = |m: String| shape_err(n, m);
    let x = ins.first().copied().unwrap_or(&[]);
    let shape = {
        let w = ins[1];
        if x.is_empty() || w.len() != 2 || x[x.len() - 1] != w[1] {
            return Err(err(format!(
                "input {x:?} does not fit weight {w:?} ([out, in])"
            )));
        }
        if ins.len() == 3 && ins[2] != [w[0]] {
            return Err(err(format!("bias {:?}, expected [{}]", ins[2], w[0])));
        }
        let mut o = x.to_vec();
        let last = o.len() - 1;
        o[last] = w[0];
        o
    };
    Ok(shape)
}

/// The CPU kernel of `Op::Linear { activation }`.
pub(crate) fn prepare_linear(ins: &[&[usize]], activation: Option<Unary>) -> Kernel {
    let x = ins[0];
    let k = x[x.len() - 1];
    Kernel::Linear {
        rows: x.iter().product::<usize>() / k.max(1),
        k,
        n: ins[1][0],
        act: activation,
        has_bias: ins.len() == 3,
        wt: None,
    }
}

/// The CPU kernel of `Op::MatMul`.
pub(crate) fn prepare_matmul(node: &Node, ins: &[&[usize]]) -> Result<Kernel> {
    let x = ins[0];
    let kernel = {
        let a: Vec<usize> = if x.len() == 1 {
            vec![1, x[0]]
        } else {
            x.to_vec()
        };
        let b: Vec<usize> = if ins[1].len() == 1 {
            vec![ins[1][0], 1]
        } else {
            ins[1].to_vec()
        };
        let (m, k) = (a[a.len() - 2], a[a.len() - 1]);
        let n = b[b.len() - 1];
        let ab = &a[..a.len() - 2];
        let bb = &b[..b.len() - 2];
        let batch = broadcast_shapes(ab, bb).ok_or_else(|| unsupported(node, "batch dims"))?;
        let sa = bcast_strides(ab, &batch);
        let sb = bcast_strides(bb, &batch);
        let total: usize = batch.iter().product();
        let mut offsets = Vec::with_capacity(total);
        let mut idx = vec![0usize; batch.len()];
        for _ in 0..total {
            let oa: usize = idx.iter().zip(&sa).map(|(i, s)| i * s).sum();
            let ob: usize = idx.iter().zip(&sb).map(|(i, s)| i * s).sum();
            offsets.push((oa * m * k, ob * k * n));
            for d in (0..idx.len()).rev() {
                idx[d] += 1;
                if idx[d] < batch[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        Kernel::MatMul(MatMulK {
            m,
            n,
            k,
            a_rs: k,
            a_cs: 1,
            b_rs: n,
            b_cs: 1,
            offsets,
            alpha: 1.0,
            c: None,
        })
    };
    Ok(kernel)
}

/// The CPU kernel of `Op::Gemm { alpha, beta, trans_a, trans_b, }`.
pub(crate) fn prepare_gemm(
    ins: &[&[usize]],
    outs: &[&[usize]],
    alpha: &f32,
    beta: &f32,
    trans_a: &bool,
    trans_b: &bool,
) -> Result<Kernel> {
    let o = outs[0];
    let kernel = {
        let (a, b) = (ins[0], ins[1]);
        let (m, k) = if *trans_a { (a[1], a[0]) } else { (a[0], a[1]) };
        let n = o[1];
        let (a_rs, a_cs) = if *trans_a { (1, a[1]) } else { (a[1], 1) };
        let (b_rs, b_cs) = if *trans_b { (1, b[1]) } else { (b[1], 1) };
        let c = if ins.len() == 3 {
            let cs = ins[2];
            let c2: Vec<usize> = match cs.len() {
                0 => vec![1, 1],
                1 => vec![1, cs[0]],
                _ => cs.to_vec(),
            };
            let rs = if c2[0] == m && m != 1 { c2[1] } else { 0 };
            let cst = if c2[1] == n && n != 1 { 1 } else { 0 };
            Some((*beta, rs, cst))
        } else {
            None
        };
        Kernel::MatMul(MatMulK {
            m,
            n,
            k,
            a_rs,
            a_cs,
            b_rs,
            b_cs,
            offsets: vec![(0, 0)],
            alpha: *alpha,
            c,
        })
    };
    Ok(kernel)
}

/// The ONNX op types imported as matrix products.
pub(crate) const ONNX: &[(&str, ImportFn)] = &[
    ("Gemm", import_gemm),
    ("MatMul", import_matmul),
    ("Einsum", import_einsum),
];

fn import_gemm(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    let alpha = c.float("alpha", 1.0)?;
    let beta = c.float("beta", 1.0)?;
    let trans_a = c.int("transA", 0)? != 0;
    let trans_b = c.int("transB", 0)? != 0;
    im.emit1(
        c,
        Op::Gemm {
            alpha,
            beta,
            trans_a,
            trans_b,
        },
        3,
    )
}

fn import_matmul(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    if let Some(ins) = batch_uniform::matmul_sides(im, c)? {
        let out = im.out_name(c, 0);
        return im.emit(c, Op::MatMul, &ins, vec![out]);
    }
    match (im.req(c, 0)?, im.req(c, 1)?) {
        // Small products of constants fold here so that what follows (GatherND of a
        // bias table) sees values; large ones are left to the compile-time folding.
        (Val::F(a), Val::F(b))
            if b.shape.len() == 2 && a.data.len().saturating_mul(b.shape[1]) <= 1 << 24 =>
        {
            Ok(vec![Val::F(fold_matmul(c, &a, &b)?)])
        }
        _ => im.emit1(c, Op::MatMul, 2),
    }
}

fn import_einsum(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    im.einsum(c)
}

impl Importer<'_> {
    /// Einsum of two operands that is a batched matrix product (attention's
    /// `bhid,bhjd->bhij` and `bhij,bhjd->bhid`, maxvit's 5-D forms): one summed letter, shared
    /// batch letters, one free letter per operand. Imported as Transpose → MatMul → Transpose;
    /// any other equation is refused naming it.
    pub(crate) fn einsum(&mut self, c: &Ctx) -> OnnxResult<Vec<Val>> {
        let eq: String = c
            .string("equation", "")?
            .chars()
            .filter(|ch| !ch.is_whitespace())
            .collect();
        let refuse = |why: &str| {
            c.unsupported_attr(
                "equation",
                format!("{eq:?}: {why} (isolane supports two-operand batched matrix products)"),
            )
        };
        let (lhs, out) = eq
            .split_once("->")
            .ok_or_else(|| refuse("no explicit output"))?;
        let ops: Vec<&str> = lhs.split(',').collect();
        if ops.len() != 2 || c.n.input.len() != 2 || eq.contains('.') {
            return Err(refuse("not two operands without ellipsis"));
        }
        let (a, b) = (ops[0], ops[1]);
        let distinct = |t: &str| t.chars().collect::<HashSet<_>>().len() == t.len();
        if !distinct(a) || !distinct(b) || !distinct(out) {
            return Err(refuse("a letter repeats within a term"));
        }
        let summed: Vec<char> = a
            .chars()
            .filter(|&l| b.contains(l) && !out.contains(l))
            .collect();
        let batch: Vec<char> = a
            .chars()
            .filter(|&l| b.contains(l) && out.contains(l))
            .collect();
        let free_a: Vec<char> = a.chars().filter(|&l| !b.contains(l)).collect();
        let free_b: Vec<char> = b.chars().filter(|&l| !a.contains(l)).collect();
        let all_out = out
            .chars()
            .all(|l| batch.contains(&l) || free_a.contains(&l) || free_b.contains(&l));
        if summed.len() != 1 || free_a.len() != 1 || free_b.len() != 1 || !all_out {
            return Err(refuse("not a batched matrix product"));
        }
        if out.len() != batch.len() + 2 {
            return Err(refuse("an operand's free letter is summed away"));
        }
        let (x, y) = (self.req(c, 0)?, self.req(c, 1)?);
        if x.rank() != a.len() || y.rank() != b.len() {
            return Err(c.bad(format!(
                "equation {eq:?} does not match operand ranks {} and {}",
                x.rank(),
                y.rank()
            )));
        }
        let k = summed[0];
        let order_a: String = batch.iter().chain([&free_a[0], &k]).collect();
        let order_b: String = batch.iter().chain([&k, &free_b[0]]).collect();
        let prod: String = batch.iter().chain([&free_a[0], &free_b[0]]).collect();
        let xa = self.permute_to(c, (c.n.input[0].clone(), x), a, &order_a, "lhs")?;
        let yb = self.permute_to(c, (c.n.input[1].clone(), y), b, &order_b, "rhs")?;
        if prod == out {
            let name = self.out_name(c, 0);
            return self.emit(c, Op::MatMul, &[xa, yb], vec![name]);
        }
        let m = self.emit_tmp(c, Op::MatMul, &[xa, yb], "product")?;
        let perm: Vec<usize> = out.chars().filter_map(|l| prod.find(l)).collect();
        let name = self.out_name(c, 0);
        self.emit(
            c,
            Op::Transpose { perm },
            &[(format!("{}:product", c.r.node), m)],
            vec![name],
        )
    }
}

/// `a @ b` for values known at import with a 2-D `b` (a positional-bias MLP on a constant
/// table), computed in f64 and rounded once.
pub(crate) fn fold_matmul(c: &Ctx, a: &Arr<f32>, b: &Arr<f32>) -> OnnxResult<Arr<f32>> {
    let (k, n) = (b.shape[0], b.shape[1]);
    let ka = a.shape.last().copied().unwrap_or(0);
    if a.shape.len() < 2 || ka != k {
        return Err(c.bad(format!(
            "MatMul of constants {:?} and {:?}: inner dimensions differ",
            a.shape, b.shape
        )));
    }
    let rows = a.data.len() / k.max(1);
    fold::numel(&[rows, n]).map_err(|e| c.bad(e))?;
    let mut out = vec![0f32; rows * n];
    for r in 0..rows {
        for j in 0..n {
            let acc: f64 = (0..k)
                .map(|i| a.data[r * k + i] as f64 * b.data[i * n + j] as f64)
                .sum();
            out[r * n + j] = acc as f32;
        }
    }
    let mut shape = a.shape.clone();
    if let Some(last) = shape.last_mut() {
        *last = n;
    }
    Ok(Arr::new(shape, out))
}
