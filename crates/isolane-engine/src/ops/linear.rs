//! Matrix products: `Op::MatMul` (numpy semantics), `Op::Gemm` (ONNX) and `Op::Linear`
//! (PyTorch's `nn.Linear`, which the passes make of the other two when the weight is constant).

use crate::error::Result;
use crate::ir::{broadcast_shapes, matmul_shape, shape_err, Node, Unary};
use crate::kernels::{bcast_strides, unsupported, Kernel, MatMulK};

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
