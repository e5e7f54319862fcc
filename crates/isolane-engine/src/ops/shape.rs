//! Ops that move or re-view data without computing: `Op::Flatten`, `Op::Reshape`,
//! `Op::Unsqueeze`, `Op::Squeeze` (views: the output is the input's data with another shape),
//! `Op::Transpose` and `Op::Expand` (strided copies), and their ONNX import. ONNX's Tile
//! becomes Reshape → Expand → Reshape per repeated axis, so every backend runs it with ops it
//! has.

use crate::error::Result;
use crate::ir::{self, Op};
use crate::ir::{broadcast_shapes, checked_numel, norm_axis, resolve_dims, shape_err, Dim, Node};
use crate::kernels::{bcast_strides, strides_of, Kernel, StridedK};
use crate::onnx::fold::{self, Arr, Sym};
use crate::onnx::import::{
    batch_uniform, check_dims_size, fmt_syms, known_shape, map_arr, node_axis, reshape_const,
    static_shape, sym_to_dim, Ctx, Importer, Val,
};
use crate::onnx::Result as OnnxResult;
use crate::ops::ImportFn;

/// The shape rule of `Op::Flatten { axis }`: `[product of dims before axis, product of the rest]`.
pub(crate) fn infer_flatten(n: &Node, x: &[usize], axis: i64) -> Result<Vec<usize>> {
    let err = |m: String| shape_err(n, m);
    let a = if axis == x.len() as i64 {
        x.len()
    } else {
        norm_axis(axis, x.len())
            .ok_or_else(|| err(format!("axis {axis} out of range for {x:?}")))?
    };
    let (Some(outer), Some(inner)) = (checked_numel(&x[..a]), checked_numel(&x[a..])) else {
        return Err(err(format!("{x:?} holds more elements than usize counts")));
    };
    Ok(vec![outer, inner])
}

/// The shape rule of `Op::Reshape { shape }`.
pub(crate) fn infer_reshape(
    n: &Node,
    x: &[usize],
    shape: &[Dim],
    batch: usize,
) -> Result<Vec<usize>> {
    let err = |m: String| shape_err(n, m);
    let o = resolve_dims(shape, Some(x), batch).map_err(err)?;
    // Checked: a target shape from a model file may multiply past usize.
    if checked_numel(&o).is_none() || checked_numel(&o) != checked_numel(x) {
        return Err(err(format!("cannot reshape {x:?} into {o:?}")));
    }
    Ok(o)
}

/// The shape rule of `Op::Expand { shape }`: the broadcast of the input and the target.
pub(crate) fn infer_expand(
    n: &Node,
    x: &[usize],
    shape: &[Dim],
    batch: usize,
) -> Result<Vec<usize>> {
    let err = |m: String| shape_err(n, m);
    let t = resolve_dims(shape, None, batch).map_err(err)?;
    broadcast_shapes(x, &t).ok_or_else(|| err(format!("cannot expand {x:?} to {t:?}")))
}

/// The shape rule of `Op::Transpose { perm }`.
pub(crate) fn infer_transpose(n: &Node, ins: &[&[usize]], perm: &[usize]) -> Result<Vec<usize>> {
    let err = |m: String| shape_err(n, m);
    let x = ins.first().copied().unwrap_or(&[]);
    let shape = {
        let mut seen = vec![false; x.len()];
        if perm.len() != x.len()
            || perm
                .iter()
                .any(|&p| p >= x.len() || std::mem::replace(&mut seen[p], true))
        {
            return Err(err(format!(
                "perm {perm:?} is not a permutation of rank {}",
                x.len()
            )));
        }
        perm.iter().map(|&p| x[p]).collect()
    };
    Ok(shape)
}

/// The shape rule of `Op::Unsqueeze { axes }`.
pub(crate) fn infer_unsqueeze(n: &Node, ins: &[&[usize]], axes: &[i64]) -> Result<Vec<usize>> {
    let err = |m: String| shape_err(n, m);
    let x = ins.first().copied().unwrap_or(&[]);
    let shape = {
        let r = x.len() + axes.len();
        let mut ax: Vec<usize> = Vec::new();
        for &a in axes {
            ax.push(norm_axis(a, r).ok_or_else(|| err(format!("axis {a} out of range")))?);
        }
        ax.sort_unstable();
        ax.dedup();
        if ax.len() != axes.len() {
            return Err(err("repeated axis".into()));
        }
        let mut o = Vec::with_capacity(r);
        let mut it = x.iter();
        for i in 0..r {
            if ax.contains(&i) {
                o.push(1);
            } else if let Some(&d) = it.next() {
                o.push(d);
            }
        }
        o
    };
    Ok(shape)
}

/// The shape rule of `Op::Squeeze { axes }`.
pub(crate) fn infer_squeeze(n: &Node, ins: &[&[usize]], axes: &[i64]) -> Result<Vec<usize>> {
    let err = |m: String| shape_err(n, m);
    let x = ins.first().copied().unwrap_or(&[]);
    let shape = {
        let mut drop = vec![false; x.len()];
        if axes.is_empty() {
            for (i, &d) in x.iter().enumerate() {
                drop[i] = d == 1;
            }
        } else {
            for &a in axes {
                let i =
                    norm_axis(a, x.len()).ok_or_else(|| err(format!("axis {a} out of range")))?;
                if x[i] != 1 {
                    return Err(err(format!("cannot squeeze dim {i} of size {}", x[i])));
                }
                drop[i] = true;
            }
        }
        x.iter()
            .enumerate()
            .filter(|(i, _)| !drop[*i])
            .map(|(_, &d)| d)
            .collect()
    };
    Ok(shape)
}

/// The CPU kernel of `Op::Transpose { perm }`: a strided copy.
pub(crate) fn prepare_transpose(x: &[usize], o: &[usize], perm: &[usize]) -> Kernel {
    let st = strides_of(x);
    Kernel::Strided(StridedK {
        out_shape: o.to_vec(),
        strides: perm.iter().map(|&p| st[p] as isize).collect(),
        base: 0,
    })
}

/// The CPU kernel of `Op::Expand`: a strided copy with stride 0 on the broadcast dims.
pub(crate) fn prepare_expand(x: &[usize], o: &[usize]) -> Kernel {
    Kernel::Strided(StridedK {
        out_shape: o.to_vec(),
        strides: bcast_strides(x, o)
            .into_iter()
            .map(|s| s as isize)
            .collect(),
        base: 0,
    })
}

/// The ONNX op types imported as shape ops.
pub(crate) const ONNX: &[(&str, ImportFn)] = &[
    ("Flatten", import_flatten),
    ("Reshape", import_reshape),
    ("Transpose", import_transpose),
    ("Unsqueeze", import_squeeze),
    ("Squeeze", import_squeeze),
    ("Expand", import_expand),
    ("Tile", import_tile),
    ("Col2Im", import_col2im),
];

fn import_flatten(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    let axis = c.int("axis", 1)?;
    let x = im.req(c, 0)?;
    let r = x.rank();
    // Flatten's axis may also equal the rank (everything in the first dim).
    let a = if axis == r as i64 {
        r
    } else {
        node_axis(c, axis, r)?
    };
    match x {
        Val::Dyn(_) => im.emit1(c, Op::Flatten { axis }, 1),
        v => {
            let s = static_shape(&v);
            let shape = vec![s[..a].iter().product(), s[a..].iter().product()];
            Ok(vec![reshape_const(c, v, shape)?])
        }
    }
}

fn import_reshape(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    im.reshape(c)
}

fn import_transpose(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    let x = im.req(c, 0)?;
    let r = x.rank();
    let perm: Vec<usize> = match c.ints("perm")? {
        None => (0..r).rev().collect(),
        Some(p) => p
            .iter()
            .map(|&a| node_axis(c, a, r))
            .collect::<OnnxResult<_>>()?,
    };
    let mut seen = vec![false; r];
    if perm.len() != r || perm.iter().any(|&p| std::mem::replace(&mut seen[p], true)) {
        return Err(c.bad(format!("perm {perm:?} is not a permutation of rank {r}")));
    }
    match x {
        Val::Dyn(_) => im.emit1(c, Op::Transpose { perm }, 1),
        v => Ok(vec![map_arr(
            c,
            v,
            |a| a.transpose(&perm),
            |a| a.transpose(&perm),
            |a| a.transpose(&perm),
        )?]),
    }
}

/// Squeeze's and Unsqueeze's axes are an attribute before opset 13, an input since.
fn import_squeeze(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    let unsqueeze = c.op() == "Unsqueeze";
    if im.m.opset < 13 {
        im.squeeze_v1(c, unsqueeze)
    } else {
        im.squeeze(c, unsqueeze)
    }
}

fn import_expand(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    im.expand(c)
}

fn import_tile(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    im.tile(c)
}

/// Col2Im (opset 18: PyTorch's `F.fold`; Transformers' MobileViTV2 folds its patches back
/// into a feature map so, dynamo export) whose blocks tile the image without overlap: strides
/// equal to the block shape, dilations 1. Each column then fills one block of its own, so
/// the fold is a data movement: `[N, C·kh·kw, bh·bw]` → Reshape `[N, C, kh, kw, bh, bw]` →
/// Transpose `[N, C, bh, kh, bw, kw]` → Reshape `[N, C, bh·kh, bw·kw]`, then the pads cropped
/// (a Slice). Overlapping blocks (sums) are refused by name.
fn import_col2im(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    let x = im.req(c, 0)?;
    let two = |i: usize, what: &str| -> OnnxResult<[usize; 2]> {
        let v = im
            .ints_input(c, i, what)?
            .ok_or_else(|| c.bad(format!("required input {i} ({what}) is missing")))?;
        match v[..] {
            [a, b] if a > 0 && b > 0 => Ok([a as usize, b as usize]),
            _ => Err(c.bad(format!(
                "{what} {v:?}: only 2-D Col2Im (two positive values) is supported"
            ))),
        }
    };
    let [h, w] = two(1, "image_shape")?;
    let [kh, kw] = two(2, "block_shape")?;
    let attr = |name: &str, n: usize, default: i64| -> OnnxResult<Vec<i64>> {
        let v = c.ints(name)?.unwrap_or_else(|| vec![default; n]);
        if v.len() != n || v.iter().any(|&d| d < default.min(1) || d > 1 << 20) {
            return Err(c.bad(format!(
                "{name} {v:?}: expected {n} values of at least {}",
                default.min(1)
            )));
        }
        Ok(v)
    };
    let dilations = attr("dilations", 2, 1)?;
    let strides = attr("strides", 2, 1)?;
    let pads = attr("pads", 4, 0)?;
    if dilations != [1, 1] || strides != [kh as i64, kw as i64] {
        return Err(c.bad(format!(
            "strides {strides:?}, dilations {dilations:?} with blocks of {kh}×{kw}: only a \
             Col2Im whose strides equal its block shape (blocks that do not overlap) and \
             dilations 1 is supported"
        )));
    }
    let [pt, pl, pb, pr] = [0, 1, 2, 3].map(|i| pads[i] as usize);
    let xs = x.sym_shape().map_err(|e| c.bad(e))?;
    let [n, ck, l] = xs[..] else {
        return Err(c.bad(format!(
            "the input is {}; expected [N, C·kh·kw, L]",
            fmt_syms(&xs)
        )));
    };
    let block = kh * kw;
    if !ck.is_const() || !l.is_const() || !(ck.c as usize).is_multiple_of(block) {
        return Err(c.bad(format!(
            "the input is {}: dimension 1 must be a fixed multiple of the block's {block} \
             elements, dimension 2 fixed",
            fmt_syms(&xs)
        )));
    }
    let ch = ck.c as usize / block;
    let (hp, wp) = (h + pt + pb, w + pl + pr);
    let (bh, bw) = (hp / kh, wp / kw);
    if bh == 0 || bw == 0 || bh * bw != l.c as usize {
        return Err(c.bad(format!(
            "{} columns for a padded image of {hp}×{wp} in blocks of {kh}×{kw}, which holds \
             {bh}×{bw}",
            l.c
        )));
    }
    // Rows past the last whole block are in no block: zeros, unless cropped by the pads.
    if pt + h > bh * kh || pl + w > bw * kw {
        return Err(c.bad(format!(
            "the image of {h}×{w} with pads {pads:?} reaches past the last whole block of \
             {kh}×{kw} (its last rows or columns would be zeros): not supported"
        )));
    }
    let f = Dim::Fixed;
    let nd = sym_to_dim(n, false).map_err(|e| c.bad(e))?;
    let name = |what: &str| format!("{}:{what}", c.r.node);
    let split = Op::Reshape {
        shape: vec![nd, f(ch), f(kh), f(kw), f(bh), f(bw)],
    };
    let y = im.emit_tmp(c, split, &[(c.n.input[0].clone(), x)], "blocks")?;
    let perm = vec![0, 1, 4, 2, 5, 3];
    let y = im.emit_tmp(c, Op::Transpose { perm }, &[(name("blocks"), y)], "placed")?;
    let image = Op::Reshape {
        shape: vec![nd, f(ch), f(bh * kh), f(bw * kw)],
    };
    let out = im.out_name(c, 0);
    if (pt, pl, bh * kh, bw * kw) == (0, 0, h, w) {
        return im.emit(c, image, &[(name("placed"), y)], vec![out]);
    }
    let y = im.emit_tmp(c, image, &[(name("placed"), y)], "padded")?;
    let crop = Op::Slice {
        starts: vec![pt as i64, pl as i64],
        ends: vec![(pt + h) as i64, (pl + w) as i64],
        axes: vec![2, 3],
        steps: vec![1, 1],
    };
    im.emit(c, crop, &[(name("padded"), y)], vec![out])
}

impl Importer<'_> {
    pub(crate) fn reshape(&mut self, c: &Ctx) -> OnnxResult<Vec<Val>> {
        let allowzero = c.int("allowzero", 0)? != 0;
        let x = self.req(c, 0)?;
        let mut shape = known_shape(c, self.req(c, 1)?)?;
        if let Some(t) = self.uniform.get(&c.n.input[0]) {
            // A value held once: the target as held (`batch_uniform::check` admitted it).
            let held = static_shape(&x);
            let (target, _) = batch_uniform::held_reshape(c, &held, t.axis, &shape, allowzero)?;
            shape = target.iter().map(|&d| Sym::k(d as i64)).collect();
        }
        if allowzero && shape.iter().any(|s| *s == Sym::k(0)) {
            return Err(c.unsupported_attr(
                "allowzero",
                "allowzero=1 with a 0 in the shape (an empty tensor)",
            ));
        }
        let dims: Vec<Dim> = shape
            .iter()
            .map(|&s| sym_to_dim(s, true))
            .collect::<OnnxResult<_, _>>()
            .map_err(|e| c.bad(format!("shape {}: {e}", fmt_syms(&shape))))?;
        check_dims_size(&dims).map_err(|e| c.bad(format!("shape {e}")))?;
        match x {
            Val::Dyn(_) => self.emit1(c, Op::Reshape { shape: dims }, 1),
            v => {
                let s = static_shape(&v);
                let out = ir::resolve_dims(&dims, Some(&s), 1).map_err(|e| c.bad(e))?;
                Ok(vec![reshape_const(c, v, out)?])
            }
        }
    }

    pub(crate) fn squeeze(&mut self, c: &Ctx, unsqueeze: bool) -> OnnxResult<Vec<Val>> {
        let x = self.req(c, 0)?;
        let axes = self.ints_input(c, 1, "axes")?;
        if unsqueeze && axes.is_none() {
            return Err(c.bad("Unsqueeze needs axes"));
        }
        let axes = axes.unwrap_or_default();
        let op = if unsqueeze {
            Op::Unsqueeze { axes }
        } else {
            Op::Squeeze { axes }
        };
        if let Val::Dyn(_) = x {
            return self.emit1(c, op, 1);
        }
        let s = static_shape(&x);
        let node = ir::Node {
            name: c.r.node.clone(),
            op,
            inputs: vec![],
            outputs: vec![],
        };
        let out = ir::infer_node(&node, &[&s], 1)
            .map_err(|e| c.bad(e.to_string()))?
            .into_iter()
            .next()
            .unwrap_or_default();
        Ok(vec![reshape_const(c, x, out)?])
    }

    pub(crate) fn expand(&mut self, c: &Ctx) -> OnnxResult<Vec<Val>> {
        let x = self.req(c, 0)?;
        let shape = known_shape(c, self.req(c, 1)?)?;
        let all_static = shape.iter().all(|s| s.is_const());
        let held = batch_uniform::held_expand(self, c)?;
        if !x.is_dyn() && (all_static || held.is_some()) {
            // Expanded to the batch, a constant is held once: the node marks it so.
            let t: Vec<usize> = held
                .map(|(h, _)| h)
                .unwrap_or_else(|| shape.iter().map(|s| s.c.max(0) as usize).collect());
            let xs = static_shape(&x);
            let out = ir::broadcast_shapes(&xs, &t)
                .ok_or_else(|| c.bad(format!("cannot expand {xs:?} to {t:?}")))?;
            match x {
                Val::I(_) => fold::numel_of::<Sym>(&out),
                Val::B(_) => fold::numel_of::<bool>(&out),
                _ => fold::numel(&out),
            }
            .map_err(|e| c.bad(e))?;
            return Ok(vec![map_arr(
                c,
                x,
                |a| a.broadcast_to(&out),
                |a| a.broadcast_to(&out),
                |a| a.broadcast_to(&out),
            )?]);
        }
        let dims: Vec<Dim> = shape
            .iter()
            .map(|&s| sym_to_dim(s, false))
            .collect::<OnnxResult<_, _>>()
            .map_err(|e| c.bad(format!("shape {}: {e}", fmt_syms(&shape))))?;
        check_dims_size(&dims).map_err(|e| c.bad(format!("shape {e}")))?;
        self.emit1(c, Op::Expand { shape: dims }, 1)
    }

    /// Squeeze and Unsqueeze before opset 13: `axes` is an attribute (optional for Squeeze).
    pub(crate) fn squeeze_v1(&mut self, c: &Ctx, unsqueeze: bool) -> OnnxResult<Vec<Val>> {
        let axes = c.ints("axes")?;
        let inputs = match axes {
            Some(a) => vec![(
                1,
                Some(Val::I(Arr::new(
                    vec![a.len()],
                    a.into_iter().map(Sym::k).collect(),
                ))),
            )],
            None => vec![],
        };
        let handler: fn(&mut Self, &Ctx) -> OnnxResult<Vec<Val>> = if unsqueeze {
            |im, c| im.squeeze(c, true)
        } else {
            |im, c| im.squeeze(c, false)
        };
        self.as_newer_form(c, inputs, &["axes"], vec![], handler)
    }

    /// Tile (opsets 6 and 13): output axis k is `repeats[k]` copies of the input's axis k.
    /// A repeat that depends on the batch (XCiT's positional encoding, `pos.repeat(B, 1, 1,
    /// 1)`) is supported on an axis of size 1, where Tile is a broadcast: one Expand. Every
    /// other repeated axis: Reshape `[…, 1, d, …]` → Expand `[…, r, d, …]` → Reshape
    /// `[…, r·d, …]` (one more dimension at a time, within every backend's rank); folded
    /// when the input is known at import.
    pub(crate) fn tile(&mut self, c: &Ctx) -> OnnxResult<Vec<Val>> {
        let mut x = self.req(c, 0)?;
        let mut reps: Vec<Sym> = match self.req(c, 1)? {
            Val::I(a) => a.data,
            v => {
                return Err(c.bad(format!(
                    "repeats is {}; expected integers known at import",
                    v.kind()
                )))
            }
        };
        let r = x.rank();
        if reps.len() != r {
            return Err(c.bad(format!(
                "repeats {} must hold one value per input dimension ({r})",
                fmt_syms(&reps)
            )));
        }
        let xs = x.sym_shape().map_err(|e| c.bad(e))?;
        let by_batch: Vec<usize> = (0..r).filter(|&k| !reps[k].is_const()).collect();
        if !by_batch.is_empty() {
            let mut target = xs.clone();
            for &k in &by_batch {
                if xs[k] != Sym::k(1) || reps[k].a < 0 || reps[k].c < 0 {
                    return Err(c.bad(format!(
                        "repeats {} depends on the batch size on axis {k}, of size {}; isolane \
                         supports that only on an axis of size 1 (a broadcast)",
                        fmt_syms(&reps),
                        xs[k]
                    )));
                }
                target[k] = reps[k];
                reps[k] = Sym::k(1);
            }
            let dims: Vec<Dim> = target
                .iter()
                .map(|&s| sym_to_dim(s, false))
                .collect::<OnnxResult<_, _>>()
                .map_err(|e| c.bad(format!("tiled shape {}: {e}", fmt_syms(&target))))?;
            check_dims_size(&dims).map_err(|e| c.bad(format!("the tiled shape {e}")))?;
            x = self.emit_tmp(
                c,
                Op::Expand { shape: dims },
                &[(c.n.input[0].clone(), x)],
                "broadcast",
            )?;
        }
        let repeats: Vec<i64> = reps.iter().map(|s| s.c).collect();
        if let Some(bad) = repeats.iter().find(|&&v| v < 1) {
            return Err(c.bad(format!(
                "repeats {repeats:?}: a repeat of {bad} is not supported (at least 1; 0 \
                 makes an empty tensor)"
            )));
        }
        if repeats.iter().all(|&v| v == 1) {
            return Ok(vec![x]);
        }
        let mut shape = x.sym_shape().map_err(|e| c.bad(e))?;
        let mut out_shape = shape.clone();
        for (d, &k) in out_shape.iter_mut().zip(&repeats) {
            *d = d.mul(Sym::k(k)).map_err(|e| c.bad(e))?;
        }
        let out_dims: Vec<Dim> = out_shape
            .iter()
            .map(|&s| sym_to_dim(s, false))
            .collect::<OnnxResult<_, _>>()
            .map_err(|e| c.bad(format!("output shape {}: {e}", fmt_syms(&out_shape))))?;
        check_dims_size(&out_dims).map_err(|e| c.bad(format!("the tiled shape {e}")))?;
        if !x.is_dyn() {
            let out: Vec<usize> = out_shape.iter().map(|s| s.c as usize).collect();
            match x {
                Val::I(_) => fold::numel_of::<Sym>(&out),
                Val::B(_) => fold::numel_of::<bool>(&out),
                _ => fold::numel(&out),
            }
            .map_err(|e| c.bad(e))?;
        }
        let mut cur = (format!("{}:broadcast", c.r.node), x);
        let last = repeats.iter().rposition(|&v| v > 1).unwrap_or(0);
        for (k, &rep) in repeats.iter().enumerate() {
            if rep == 1 {
                continue;
            }
            let split = |with: Sym| -> OnnxResult<Vec<Sym>> {
                let mut s = shape.clone();
                s.insert(k, with);
                Ok(s)
            };
            let (ones, wide) = (split(Sym::k(1))?, split(Sym::k(rep))?);
            let mut merged = shape.clone();
            merged[k] = out_shape[k];
            let next = if cur.1.is_dyn() {
                let dims = |s: &[Sym]| -> OnnxResult<Vec<Dim>> {
                    s.iter()
                        .map(|&d| sym_to_dim(d, false))
                        .collect::<OnnxResult<_, _>>()
                        .map_err(|e| c.bad(format!("shape {}: {e}", fmt_syms(s))))
                };
                let apart = self.emit_tmp(
                    c,
                    Op::Reshape {
                        shape: dims(&ones)?,
                    },
                    &[cur],
                    "apart",
                )?;
                let copies = self.emit_tmp(
                    c,
                    Op::Expand {
                        shape: dims(&wide)?,
                    },
                    &[(format!("{}:apart", c.r.node), apart)],
                    "copies",
                )?;
                if k == last {
                    let out = self.out_name(c, 0);
                    let ins = [(format!("{}:copies", c.r.node), copies)];
                    let op = Op::Reshape {
                        shape: dims(&merged)?,
                    };
                    return self.emit(c, op, &ins, vec![out]);
                }
                self.emit_tmp(
                    c,
                    Op::Reshape {
                        shape: dims(&merged)?,
                    },
                    &[(format!("{}:copies", c.r.node), copies)],
                    "tiled",
                )?
            } else {
                let st = |s: &[Sym]| s.iter().map(|d| d.c as usize).collect::<Vec<_>>();
                let (ones, wide, merged) = (st(&ones), st(&wide), st(&merged));
                map_arr(
                    c,
                    cur.1,
                    |a| {
                        a.reshape(ones.clone())?
                            .broadcast_to(&wide)?
                            .reshape(merged.clone())
                    },
                    |a| {
                        a.reshape(ones.clone())?
                            .broadcast_to(&wide)?
                            .reshape(merged.clone())
                    },
                    |a| {
                        a.reshape(ones.clone())?
                            .broadcast_to(&wide)?
                            .reshape(merged.clone())
                    },
                )?
            };
            shape = merged;
            self.fresh += 1;
            cur = (format!("{}:tiled{}", c.r.node, self.fresh), next);
        }
        Ok(vec![cur.1])
    }
}

#[cfg(test)]
mod expand_tests {
    use crate::backend::{Backend, Precision};
    use crate::ir::Tensor;
    use crate::ops::testing::{floats, import, ints, node, with_int};

    /// transformers 5's attention mask in a classic export of ViT/DeiT/BEiT: a bool of
    /// constant position indices Expanded to `[B, 1, S, S]`, read by Where and added to the
    /// scores. Refused as "a bool constant used as a runtime tensor"; now held with one row.
    fn mask_nodes(
        mask_rows: i64,
    ) -> (
        Vec<crate::onnx::proto::NodeProto>,
        Vec<crate::onnx::proto::TensorProto>,
    ) {
        let nodes = vec![
            node("Shape", &["x"], "s"),
            with_int(node("Gather", &["s", "zero"], "b"), "axis", 0),
            node("Unsqueeze", &["b", "axes0"], "b1"),
            with_int(node("Concat", &["b1", "tail"], "shape"), "axis", 0),
            node("GreaterOrEqual", &["pos", "one"], "mask"),
            node("Expand", &["mask", "shape"], "wide"),
            node("Where", &["wide", "keep", "drop"], "bias"),
            node("Add", &["x", "bias"], "y"),
        ];
        let n = mask_rows as usize * 3;
        let pos: Vec<i64> = (0..n as i64).map(|i| i % 3).collect();
        let inits = vec![
            ints("zero", &[], &[0]),
            ints("axes0", &[1], &[0]),
            ints("tail", &[3], &[1, 3, 3]),
            ints("pos", &[mask_rows, 1, 1, 3], &pos),
            ints("one", &[], &[1]),
            floats("keep", &[], &[0.0]),
            floats("drop", &[], &[-100.0]),
        ];
        (nodes, inits)
    }

    #[test]
    fn a_bool_constant_expanded_to_the_batch_masks_every_row() {
        let (nodes, inits) = mask_nodes(1);
        let g = import(nodes, inits, &[2, 2, 3, 3], true).unwrap();
        // The same graph at two batch sizes: column 0 masked in every row of every item.
        for batch in [2usize, 3] {
            let shape = vec![batch, 2, 3, 3];
            let x: Vec<f32> = (0..batch * 18).map(|i| i as f32 * 0.5).collect();
            let want: Vec<f32> = x
                .iter()
                .enumerate()
                .map(|(i, &v)| if i % 3 == 0 { v - 100.0 } else { v })
                .collect();
            let feed = Tensor::new(shape.clone(), x.clone()).unwrap();
            let reference = crate::reference::interpret(&g, batch, &[feed]).unwrap();
            assert_eq!(reference[0].shape, shape);
            assert_eq!(reference[0].data, want);
            let mut cpu = crate::CpuBackend::new(1)
                .compile(&g, batch, Precision::Fp32)
                .unwrap();
            cpu.input_mut().copy_from_slice(&x);
            cpu.run().unwrap();
            assert_eq!(cpu.output_shape_at(0), shape.as_slice());
            assert_eq!(cpu.output(), want.as_slice());
        }
    }

    /// A constant of two rows does not broadcast to the batch: refused by name, not folded.
    #[test]
    fn a_bool_constant_of_several_rows_expanded_to_the_batch_is_refused() {
        let (nodes, inits) = mask_nodes(2);
        let e = import(nodes, inits, &[2, 2, 3, 3], true).unwrap_err();
        assert!(e.contains("Expand") && e.contains("Expand_wide"), "{e}");
    }
}

#[cfg(test)]
mod col2im_tests {
    use crate::ops::testing::{ints, node, run, with_ints};

    /// MobileViTV2's `F.fold` (dynamo: Col2Im) was refused as an unsupported op. Checked
    /// against the spec's definition, `y[n, c, bi·kh + i - pt, bj·kw + j - pl] = x[n, (c·kh +
    /// i)·kw + j, bi·bw + bj]`, with pads cropping a row and a column.
    #[test]
    fn col2im_of_blocks_that_tile_the_image_matches_its_definition() {
        let (ch, kh, kw, h, w, pads) = (2, 2, 3, 3, 5, [1usize, 0, 0, 1]);
        let (bh, bw) = ((h + pads[0] + pads[2]) / kh, (w + pads[1] + pads[3]) / kw);
        let l = bh * bw;
        let x: Vec<f32> = (0..ch * kh * kw * l).map(|v| v as f32).collect();
        let mut n = node("Col2Im", &["x", "image", "block"], "y");
        n = with_ints(n, "strides", &[kh as i64, kw as i64]);
        n = with_ints(n, "pads", &pads.map(|p| p as i64));
        let inits = || {
            vec![
                ints("image", &[2], &[h as i64, w as i64]),
                ints("block", &[2], &[kh as i64, kw as i64]),
            ]
        };
        let y = run(vec![n], inits(), &[1, ch * kh * kw, l], &x).unwrap();
        assert_eq!(y.shape, vec![1, ch, h, w]);
        for c in 0..ch {
            for r in 0..h {
                for q in 0..w {
                    let (pr, pq) = (r + pads[0], q + pads[1]);
                    let (bi, i, bj, j) = (pr / kh, pr % kh, pq / kw, pq % kw);
                    let want = x[((c * kh + i) * kw + j) * l + bi * bw + bj];
                    assert_eq!(y.data[(c * h + r) * w + q], want, "({c}, {r}, {q})");
                }
            }
        }
        // Overlapping blocks (a sum) are refused by name, saying what is supported.
        let n = with_ints(
            node("Col2Im", &["x", "image", "block"], "y"),
            "strides",
            &[1, 1],
        );
        let e = run(vec![n], inits(), &[1, ch * kh * kw, l], &x).unwrap_err();
        assert!(e.contains("strides equal its block shape"), "{e}");
    }
}
