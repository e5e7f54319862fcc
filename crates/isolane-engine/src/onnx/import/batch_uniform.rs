//! Values the size of the batch that do not depend on the input's rows.
//!
//! PyTorch's classic exporter writes `torch.zeros(x.shape[0], h, w)` (edgenext's positional
//! encoding) or `torch.ones(B, H, W)` (DETR's pixel mask) as a ConstantOfShape whose shape
//! holds the batch size, which import-time folding cannot know. Such a value is the same for
//! every sample, so it is held once: the real value is the held one repeated B times along one
//! axis (its *batch axis*; the real size there is B times the held one). Ops that treat the
//! repeats alike compute on the held value, which gives each repeat what the model computes,
//! and where it meets the batched activations it broadcasts. The batch axis moves with the
//! ops (DETR unsqueezes its mask to `[1, B, H, W]`, resizes it, takes `[0]` back, flattens it
//! to `[B·HW]`); [`check`] admits the ops whose result is again such a repetition (and says
//! along which axis) and refuses the rest by name.
//!
//! Integers that count along the batch (`Range(0, B)`, and `arange(B)·HW + position`, how the
//! classic exporter indexes a flattened `[B·HW]` mask by sample) are held the same way, with a
//! [`Tiled::step`]: repeat b of the value is the held one plus b times the step. Only the ops
//! that keep that form (moves, sums, products by a constant) may compute on them, and a
//! Gather of a repeated value by such indices is computed at import when each sample's
//! indices fall in its own repeat (then the result is the same for every sample again).

use super::*;

/// The batch size as a symbolic integer (`1·B + 0`).
pub(crate) const BATCH: Sym = Sym { a: 1, c: 0 };

/// How a value the size of the batch is held (`Importer::uniform`): its real value is the held
/// one (`Importer::vals`) repeated B times along `axis`.
#[derive(Debug, Clone)]
pub(crate) struct Tiled {
    pub(crate) axis: usize,
    /// For integers that count along the batch: repeat b is the held value plus b times this
    /// (the held value's shape). `None`: every repeat is the held value.
    pub(crate) step: Option<Arr<Sym>>,
}

/// Elementwise ops: held values may be any of their inputs if the others broadcast along the
/// batch axis ([`elementwise`]).
const ELEMENTWISE: &[&str] = &[
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "And",
    "Or",
    "Equal",
    "Less",
    "Greater",
    "LessOrEqual",
    "GreaterOrEqual",
    "Where",
    "Max",
    "Min",
    "Mod",
];

/// Ops of one data input that compute each element from the same element (any batch axis).
const UNARY: &[&str] = &[
    "Identity",
    "Cast",
    "CastLike",
    "Not",
    "Neg",
    "Abs",
    "Sin",
    "Cos",
    "Exp",
    "Log",
    "Sqrt",
    "Relu",
    "Sigmoid",
    "Tanh",
    "Erf",
    "Reciprocal",
    "Floor",
    "Ceil",
    "Clip",
    "HardSwish",
];

/// Ops that compute each sample of an `[N, C, ...]` tensor on its own: the batch axis must be
/// dimension 0.
const PER_SAMPLE: &[&str] = &[
    "Conv",
    "BatchNormalization",
    "MaxPool",
    "AveragePool",
    "GlobalAveragePool",
];

/// The shape of a ConstantOfShape whose shape input is `[B, fixed...]`, held with one row.
pub(crate) fn one_row_shape(im: &Importer, c: &Ctx) -> Result<Option<Vec<i64>>> {
    let Some(Val::I(a)) = im.get(c, 0)? else {
        return Ok(None);
    };
    match a.data.split_first() {
        Some((&first, rest)) if first == BATCH && rest.iter().all(|s| s.is_const()) => Ok(Some(
            std::iter::once(1).chain(rest.iter().map(|s| s.c)).collect(),
        )),
        _ => Ok(None),
    }
}

/// The held shape, and the batch axis, of an Expand to a shape of one `k·B` entry whose other
/// entries are fixed: of a value held so (whose batch axis lands there), or of an integer or
/// bool constant that broadcasts there (transformers 5's attention mask, classic export: a
/// bool of position indices expanded to the batch; a constant's repeats are all equal). A
/// float constant is not: it becomes a runtime Expand, which Concat with a batched tensor
/// needs (ViT's class token).
pub(crate) fn held_expand(im: &Importer, c: &Ctx) -> Result<Option<(Vec<usize>, usize)>> {
    let x = im.req(c, 0)?;
    let tiled = im.uniform.get(&c.n.input[0]);
    if tiled.is_none() && !matches!(x, Val::B(_) | Val::I(_)) {
        return Ok(None);
    }
    let Ok(target) = super::known_shape(c, im.req(c, 1)?) else {
        return Ok(None);
    };
    let xs = super::static_shape(&x);
    let Some(off) = target.len().checked_sub(xs.len()) else {
        return Ok(None);
    };
    let batch: Vec<usize> = (0..target.len())
        .filter(|&i| !target[i].is_const())
        .collect();
    let at = match (tiled, batch.as_slice()) {
        (Some(t), _) => t.axis + off,
        (None, &[p]) => p,
        _ => return Ok(None),
    };
    let mut held = Vec::with_capacity(target.len());
    for (i, s) in target.iter().enumerate() {
        let xd = i.checked_sub(off).map(|j| xs[j]);
        held.push(match (i == at, tiled) {
            // The held value's own batch axis: the target must keep it (its real size, or 1).
            (true, Some(_))
                if batch.iter().all(|&p| p == at)
                    && (*s == Sym::k(1) || xd.is_some_and(|k| *s == Sym { a: k as i64, c: 0 })) =>
            {
                1
            }
            // A constant broadcast to `k·B` there: held with k repeats of its one row.
            (true, None) if s.c == 0 && s.a > 0 && xd.is_none_or(|d| d == 1) => s.a as usize,
            (false, _) if s.is_const() && s.c >= 0 => s.c as usize,
            _ => return Ok(None),
        });
    }
    Ok(Some((held, at)))
}

/// Whether node `c` just created a held value (a ConstantOfShape of `[B, ...]`, or an Expand
/// of a constant to the batch), and its batch axis.
pub(crate) fn made_by(im: &Importer, c: &Ctx) -> Option<usize> {
    match c.op() {
        "ConstantOfShape" => matches!(one_row_shape(im, c), Ok(Some(_))).then_some(0),
        "Expand"
            if c.n
                .input
                .first()
                .is_some_and(|x| !im.uniform.contains_key(x)) =>
        {
            held_expand(im, c).ok().flatten().map(|(_, axis)| axis)
        }
        _ => None,
    }
}

/// A `Range(start, k·B + c, delta)` of a batch-dependent limit whose length is a multiple of
/// the batch (`arange(B)`): held as its first `len / B` values with the step `delta · len / B`
/// per repeat. `None` where the node is not such a Range (its own handler decides).
pub(crate) fn range(im: &Importer, c: &Ctx) -> Result<Option<(Val, Tiled)>> {
    if c.op() != "Range" {
        return Ok(None);
    }
    let (Some(Val::I(s)), Some(Val::I(l)), Some(Val::I(d))) =
        (im.get(c, 0)?, im.get(c, 1)?, im.get(c, 2)?)
    else {
        return Ok(None);
    };
    let one = |a: &Arr<Sym>| (a.data.len() == 1).then(|| a.data[0]);
    let (Some(s), Some(l), Some(d)) = (one(&s), one(&l), one(&d)) else {
        return Ok(None);
    };
    if l.is_const() || !s.is_const() || !d.is_const() {
        return Ok(None);
    }
    let (s, d) = (s.c, d.c);
    // The length ceil((a·B + c − s) / d) is k·B for every B exactly when d divides a and
    // −d < c − s ≤ 0.
    let off =
        l.c.checked_sub(s)
            .ok_or_else(|| c.bad("Range overflows int64"))?;
    if d <= 0 || l.a <= 0 || l.a % d != 0 || off > 0 || off <= -d {
        return Err(c.bad(format!(
            "Range({s}, {l}, {d}): a range whose length depends on the batch is supported \
             when it is a multiple of the batch (a delta ≥ 1 dividing the limit's multiple \
             of B)"
        )));
    }
    let k = l.a / d;
    let held = (0..k)
        .map(|r| r.checked_mul(d).and_then(|v| v.checked_add(s)).map(Sym::k))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| c.bad("Range overflows int64"))?;
    fold::numel_of::<Sym>(&[held.len()]).map_err(|e| c.bad(e))?;
    let step = Sym::k(
        d.checked_mul(k)
            .ok_or_else(|| c.bad("Range overflows int64"))?,
    );
    let n = held.len();
    let tiled = Tiled {
        axis: 0,
        step: Some(Arr::new(vec![n], vec![step; n])),
    };
    Ok(Some((Val::I(Arr::new(vec![n], held)), tiled)))
}

/// The held size of `v` along its batch axis.
fn axis_size(c: &Ctx, v: &Val, axis: usize) -> Result<usize> {
    super::static_shape(v).get(axis).copied().ok_or_else(|| {
        c.bad(format!(
            "internal: batch axis {axis} of a rank-{} value",
            v.rank()
        ))
    })
}

/// A value whose shape depends on the batch (a runtime tensor of the real batch).
pub(crate) fn batched(v: &Val) -> bool {
    v.sym_shape()
        .ok()
        .is_some_and(|s| s.iter().any(|d| !d.is_const()))
}

impl Importer<'_> {
    /// The shape of input `name` (value `v`) as the model sees it: a held value's batch axis
    /// is B times its held size.
    pub(crate) fn real_shape(&self, name: &str, v: &Val) -> std::result::Result<Vec<Sym>, String> {
        let mut s = v.sym_shape()?;
        if let Some(t) = self.uniform.get(name) {
            if let Some(d) = s.get_mut(t.axis) {
                *d = Sym {
                    a: d.c.max(1),
                    c: 0,
                };
            }
        }
        Ok(s)
    }
}

/// The held target, and the batch axis, of a Reshape of a held value (its held shape `held`,
/// batch axis `axis`) to `target` (the file's entries: 0 copies, −1 is inferred). The repeats
/// stay whole when the target's dimensions before its batch axis hold as many elements as the
/// input's before its own: one entry `k·B` (or the −1, which then takes the batch), the others
/// fixed.
pub(crate) fn held_reshape(
    c: &Ctx,
    held: &[usize],
    axis: usize,
    target: &[Sym],
    allowzero: bool,
) -> Result<(Vec<usize>, usize)> {
    let bad = || {
        c.bad(format!(
            "a Reshape to {} of a value the size of the batch held once (isolane holds such \
             values as one repeat, the repeats being equal) that is {}, its batch along \
             dimension {axis}: the target splits or merges the batch with other dimensions",
            fmt_syms(target),
            fmt_syms(
                &held
                    .iter()
                    .enumerate()
                    .map(|(i, &d)| if i == axis {
                        Sym { a: d as i64, c: 0 }
                    } else {
                        Sym::k(d as i64)
                    })
                    .collect::<Vec<_>>()
            ),
        ))
    };
    if axis >= held.len() {
        return Err(c.bad(format!(
            "internal: batch axis {axis} of a rank-{} value",
            held.len()
        )));
    }
    let n: usize = held.iter().product();
    // Entries as held sizes; `None` for the −1 and the batch-carrying entry is noted.
    let mut out: Vec<Option<usize>> = Vec::with_capacity(target.len());
    let (mut at, mut infer) = (None, None);
    for (i, &s) in target.iter().enumerate() {
        let s = match (s.a, s.c) {
            (0, 0) if !allowzero => match held.get(i) {
                Some(&d) if i == axis => Sym { a: d as i64, c: 0 },
                Some(&d) => Sym::k(d as i64),
                None => return Err(bad()),
            },
            _ => s,
        };
        match (s.a, s.c) {
            (0, -1) if infer.is_none() => {
                infer = Some(i);
                out.push(None);
            }
            (0, c) if c >= 0 => out.push(Some(c as usize)),
            (a, 0) if a > 0 && at.is_none() => {
                at = Some(i);
                out.push(Some(a as usize));
            }
            _ => return Err(bad()),
        }
    }
    let known: usize = out.iter().flatten().product();
    let at = match (at, infer) {
        (Some(at), Some(i)) if known > 0 && n.is_multiple_of(known) => {
            out[i] = Some(n / known);
            at
        }
        (Some(at), None) if known == n => at,
        // No entry names the batch: the −1 takes it.
        (None, Some(i)) if known > 0 && n.is_multiple_of(known) => {
            out[i] = Some(n / known);
            i
        }
        _ => return Err(bad()),
    };
    let out: Vec<usize> = out.into_iter().flatten().collect();
    let before = |s: &[usize], k: usize| s[..k].iter().product::<usize>();
    if before(held, axis) != before(&out, at) {
        return Err(bad());
    }
    Ok((out, at))
}

/// Refuses node `c`, which reads a held value, unless its result is again a repetition of
/// the held result along one axis: that axis, or `None` where the result is an ordinary value
/// (a Shape).
pub(crate) fn check(im: &Importer, c: &Ctx) -> Result<Option<usize>> {
    let op = c.op();
    let ins = &c.n.input;
    let tile = |i: usize| ins.get(i).and_then(|n| im.uniform.get(n));
    let stepped = (0..ins.len()).any(|i| tile(i).is_some_and(|t| t.step.is_some()));
    let refuse = |why: &str| {
        let name = ins
            .iter()
            .find(|i| im.uniform.contains_key(*i))
            .cloned()
            .unwrap_or_default();
        let Some(t) = im.uniform.get(&name) else {
            return c.bad(format!("internal: {op} reads no value held once"));
        };
        let what = if t.step.is_some() {
            "integers counting along the batch (isolane holds them as one repeat and its step)"
        } else {
            "a value the size of the batch built by a ConstantOfShape (isolane holds it once, \
             the repeats being equal)"
        };
        c.bad(format!(
            "{op} of {name:?}, {what}, its batch along dimension {}: {why}: not supported",
            t.axis
        ))
    };
    // Apart from elementwise ops, Concat and Gather's indices, the rule is about the op's data
    // input: a held weight, shape, axes or bound means something else entirely (a weight's
    // dimension 0 is its output channels, not the batch).
    let is_elementwise = ELEMENTWISE.contains(&op);
    if !(is_elementwise || matches!(op, "Concat" | "Gather" | "MatMul"))
        && (1..ins.len()).any(|i| tile(i).is_some())
    {
        return Err(refuse("it is not the op's data input"));
    }
    let counts_ok = matches!(
        op,
        "Identity"
            | "Neg"
            | "Add"
            | "Sub"
            | "Mul"
            | "Unsqueeze"
            | "Squeeze"
            | "Reshape"
            | "Flatten"
            | "Transpose"
            | "Expand"
            | "Concat"
            | "Slice"
            | "Gather"
            | "Shape"
    ) || (op == "Cast" && matches!(c.peek_int("to"), Some(6 | 7)));
    if stepped && !counts_ok {
        return Err(refuse(
            "its result would not be the held value plus a step per repeat",
        ));
    }
    let x = im.req(c, 0)?;
    let held = super::static_shape(&x);
    let rank = held.len();
    let t0 = tile(0);
    let axis0 = t0.map(|t| t.axis);
    let axis_of = |a: i64, r: usize| node_axis(c, a, r);
    let out = match op {
        "Shape" => return Ok(None),
        _ if is_elementwise => return elementwise(im, c, stepped).map(Some),
        _ if UNARY.contains(&op) => axis0,
        _ if PER_SAMPLE.contains(&op) => match axis0 {
            Some(0) => Some(0),
            _ => return Err(refuse("the op's samples are its dimension 0")),
        },
        "CumSum" => {
            let a = im
                .ints_input(c, 1, "axis")?
                .and_then(|a| a.first().copied());
            match (a.map(|a| axis_of(a, rank)).transpose()?, axis0) {
                (Some(a), Some(t)) if a != t => Some(t),
                _ => return Err(refuse("it sums along the batch")),
            }
        }
        "Slice" => {
            // Without axes, a Slice starts at dimension 0 (before opset 10 its bounds are
            // attributes).
            let (axes, n) = if im.m.opset < 10 {
                let n = c.peek_ints("starts").map_or(0, |s| s.len() as i64);
                (c.peek_ints("axes"), n)
            } else {
                let n = match im.get(c, 1)? {
                    Some(v) => v
                        .sym_shape()
                        .map_err(|e| c.bad(e))?
                        .first()
                        .map_or(0, |d| d.c),
                    None => 0,
                };
                (im.ints_input(c, 3, "axes")?, n)
            };
            let axes = axes.unwrap_or_else(|| (0..n).collect());
            let t = axis0.unwrap_or(0);
            for &a in &axes {
                if axis_of(a, rank)? == t {
                    return Err(refuse("it slices the batch axis"));
                }
            }
            axis0
        }
        "Softmax" | "LayerNormalization" => {
            let whole = op == "LayerNormalization" || im.m.opset < 13;
            let default = if op == "Softmax" && whole { 1 } else { -1 };
            let a = axis_of(c.peek_int("axis").unwrap_or(default), rank)?;
            let t = axis0.unwrap_or(0);
            if (whole && t >= a) || t == a {
                return Err(refuse("it normalises along the batch"));
            }
            axis0
        }
        "Unsqueeze" | "Squeeze" => {
            let axes = if im.m.opset >= 13 {
                im.ints_input(c, 1, "axes")?
            } else {
                c.peek_ints("axes")
            };
            let t = axis0.unwrap_or(0);
            let Some(axes) = axes else {
                return Err(refuse(
                    "Squeeze without axes would drop the held size-1 axis",
                ));
            };
            if op == "Unsqueeze" {
                let r = rank + axes.len();
                let added: Vec<usize> =
                    axes.iter().map(|&a| axis_of(a, r)).collect::<Result<_>>()?;
                (0..r).filter(|p| !added.contains(p)).nth(t)
            } else {
                let gone: Vec<usize> = axes
                    .iter()
                    .map(|&a| axis_of(a, rank))
                    .collect::<Result<_>>()?;
                if gone.contains(&t) {
                    return Err(refuse("it squeezes the batch axis"));
                }
                Some(t - gone.iter().filter(|&&g| g < t).count())
            }
        }
        "Transpose" => {
            let t = axis0.unwrap_or(0);
            match c.peek_ints("perm") {
                Some(p) => p.iter().position(|&a| a == t as i64),
                None => rank.checked_sub(1 + t),
            }
        }
        "Flatten" => {
            let f = c.peek_int("axis").unwrap_or(1);
            let f = if f < 0 { f + rank as i64 } else { f };
            let t = axis0.unwrap_or(0);
            if f < 0 || f as usize > rank {
                return Err(c.bad(format!("axis {f} is out of range for rank {rank}")));
            }
            let f = f as usize;
            if t >= rank {
                return Err(c.bad(format!("internal: batch axis {t} of a rank-{rank} value")));
            }
            let (from, to, out) = if t < f { (0, t, 0) } else { (f, t, 1) };
            if held[from..to].iter().any(|&d| d != 1) {
                return Err(refuse(
                    "the flattened dimensions before the batch axis would interleave the repeats",
                ));
            }
            Some(out)
        }
        "Reshape" => {
            let target = super::known_shape(c, im.req(c, 1)?)?;
            let allowzero = c.peek_int("allowzero").unwrap_or(0) != 0;
            let (_, at) = held_reshape(c, &held, axis0.unwrap_or(0), &target, allowzero)?;
            Some(at)
        }
        "Expand" => match held_expand(im, c)? {
            Some((_, at)) => Some(at),
            None => return Err(refuse("the target shape does not keep the batch axis")),
        },
        "Resize" => match axis0 {
            // Only H and W (dimensions 2 and 3) may be resized; the handler checks the sizes.
            Some(t) if t < 2 => Some(t),
            _ => return Err(refuse("it would resize the batch axis")),
        },
        "Concat" => {
            let a = axis_of(c.peek_int("axis").unwrap_or(0), rank)?;
            let k = held.get(axis0.unwrap_or(0)).copied();
            for (i, name) in ins.iter().enumerate().filter(|(_, n)| !n.is_empty()) {
                let same = tile(i).is_some_and(|t| Some(t.axis) == axis0)
                    && im.vals.get(name).is_some_and(|v| {
                        super::static_shape(v).get(axis0.unwrap_or(0)).copied() == k
                    });
                if !same {
                    return Err(refuse(
                        "every input of the Concat must be held along the same axis",
                    ));
                }
            }
            if axis0 == Some(a) {
                return Err(refuse("it concatenates along the batch axis"));
            }
            axis0
        }
        "MatMul" => return matmul(im, c).map(Some),
        "Gather" => return gather(im, c, &held).map(Some),
        _ => return Err(refuse("the op is not known to treat the repeats alike")),
    };
    out.map(Some)
        .ok_or_else(|| c.bad("internal: no batch axis for the held value"))
}

/// A matrix product of held values: the repeats are along a dimension of the product's batch
/// (where the other side broadcasts, as in [`elementwise`]), the left side's rows or the right
/// side's columns (the other side then the same for every sample); never along the summed
/// dimension. The batch axis of the result.
fn matmul(im: &Importer, c: &Ctx) -> Result<usize> {
    let ins = &c.n.input;
    let sides = [im.req(c, 0)?, im.req(c, 1)?];
    let ranks = [sides[0].rank(), sides[1].rank()];
    let out_rank = ranks[0].max(ranks[1]);
    let bad = |why: &str| {
        c.bad(format!(
            "MatMul of {:?} and {:?} (a value the size of the batch held once): {why}: not \
             supported",
            ins[0], ins[1]
        ))
    };
    if ranks.iter().any(|&r| r < 2) {
        return Err(bad("a side of rank below 2"));
    }
    let mut held = None;
    for (i, v) in sides.iter().enumerate() {
        let Some(t) = im.uniform.get(&ins[i]) else {
            continue;
        };
        let r = ranks[i];
        let p = match (i, t.axis) {
            (_, a) if a + 2 < r => out_rank - r + a,
            (0, a) if a + 2 == r => out_rank - 2,
            (1, a) if a + 1 == r => out_rank - 1,
            _ => return Err(bad("it sums along the batch")),
        };
        if !agree(&mut held, (p, axis_size(c, v, t.axis)?)) {
            return Err(bad("the sides hold the batch along different axes"));
        }
    }
    let Some((at, k)) = held else {
        return Err(c.bad("internal: MatMul reads no held value"));
    };
    for (i, v) in sides.iter().enumerate() {
        if im.uniform.contains_key(&ins[i]) {
            continue;
        }
        let s = v.sym_shape().map_err(|e| c.bad(e))?;
        let off = out_rank - s.len();
        for (j, d) in s.iter().enumerate() {
            // Only a dimension of the product's batch broadcasts along the repeats.
            let fine = if j + off == at && j + 2 < s.len() {
                // Of size 1 it broadcasts; of the real size (`k·B`), the held side is
                // repeated to it at run time ([`matmul_sides`]).
                *d == Sym::k(1) || *d == Sym { a: k as i64, c: 0 }
            } else {
                d.is_const()
            };
            if !fine {
                return Err(bad(
                    "the other side does not broadcast along the batch axis",
                ));
            }
        }
    }
    Ok(at)
}

/// The sides of a MatMul where one is held once and the other is batched at run time (DETR's
/// decoder: attention weights times the values of its zero queries): the held side expanded
/// to the batch at run time, as its real shape, so that the product's batch dimensions match
/// (the cuda backend broadcasts a side only when it has one matrix). `None` otherwise.
pub(crate) fn matmul_sides(im: &mut Importer, c: &Ctx) -> Result<Option<Vec<(String, Val)>>> {
    let mut ins = Vec::with_capacity(2);
    for i in 0..2 {
        let v = im.req(c, i)?;
        ins.push((c.n.input[i].clone(), v));
    }
    let held = |i: usize| im.uniform.get(&ins[i].0).cloned();
    let (i, t) = match (held(0), held(1)) {
        (Some(t), None) if batched(&ins[1].1) => (0, t),
        (None, Some(t)) if batched(&ins[0].1) => (1, t),
        _ => return Ok(None),
    };
    let v = repeat_to_batch(im, c, ins[i].clone(), t.axis)?;
    ins[i] = (format!("{}:to_batch", ins[i].0), v);
    Ok(Some(ins))
}

/// A held value as its real value at run time: held size 1 on the batch axis, an Expand to
/// B there; k, the held value as `[…, 1, k, …]` expanded to `[…, B, k, …]` and merged to
/// `[…, B·k, …]` (the transformers 4 attention's `[B·heads, …]`).
fn repeat_to_batch(im: &mut Importer, c: &Ctx, x: (String, Val), axis: usize) -> Result<Val> {
    let held = super::static_shape(&x.1);
    let k = axis_size(c, &x.1, axis)?;
    let fixed = |s: &[usize]| s.iter().map(|&d| Dim::Fixed(d)).collect::<Vec<_>>();
    let (before, after) = (fixed(&held[..axis]), fixed(&held[axis + 1..]));
    let dims = |mid: Vec<Dim>| [before.clone(), mid, after.clone()].concat();
    if k == 1 {
        let shape = dims(vec![Dim::Batch]);
        return im.emit_tmp(c, Op::Expand { shape }, &[x], "to_batch");
    }
    let split = dims(vec![Dim::Fixed(1), Dim::Fixed(k)]);
    let v = im.emit_tmp(c, Op::Reshape { shape: split }, &[x], "to_batch")?;
    let name = format!("{}:to_batch_split", c.r.node);
    let shape = dims(vec![Dim::Batch, Dim::Fixed(k)]);
    let v = im.emit_tmp(c, Op::Expand { shape }, &[(name.clone(), v)], "to_batch")?;
    let merged = dims(vec![Dim::BatchTimes(k)]);
    im.emit_tmp(c, Op::Reshape { shape: merged }, &[(name, v)], "to_batch")
}

/// Gather reading a held value (data or indices): the batch axis of its result.
fn gather(im: &Importer, c: &Ctx, held: &[usize]) -> Result<usize> {
    let ins = &c.n.input;
    let (td, ti) = (
        im.uniform.get(&ins[0]),
        ins.get(1).and_then(|i| im.uniform.get(i)),
    );
    let g = node_axis(c, c.peek_int("axis").unwrap_or(0), held.len())?;
    let idx = im.req(c, 1)?;
    let irank = idx.rank();
    let bad = |why: String| c.bad(format!("Gather of {:?} by {:?}: {why}", ins[0], ins[1]));
    match (td, ti) {
        (Some(t), None) if t.axis != g => Ok(if t.axis < g {
            t.axis
        } else {
            t.axis - 1 + irank
        }),
        (Some(t), None) => Err(bad(format!(
            "indices known at import along the batch axis ({}) of a value held once: not \
             supported",
            t.axis
        ))),
        (None, Some(t)) if t.step.is_none() => Ok(g + t.axis),
        (None, Some(_)) => Err(bad(
            "indices that count along the batch into a value that is not the size of the \
             batch give each sample other values: not supported"
                .into(),
        )),
        (Some(td), Some(ti)) if td.axis == g && td.step.is_none() => {
            // Sample b reads index q + b·p of the data, B repeats of k: the held value again
            // when every index stays in sample b's own repeat (p is 0 or k, 0 ≤ q < k).
            let k = held[g] as i64;
            let Val::I(q) = &idx else {
                return Err(bad("the indices are not integers".into()));
            };
            let zero = Sym::k(0);
            let steps = ti.step.as_ref().map(|s| s.data.as_slice());
            for (j, q) in q.data.iter().enumerate() {
                let p = steps
                    .map_or(Some(zero), |s| s.get(j).copied())
                    .unwrap_or(Sym::k(-1));
                let fine = q.is_const() && (0..k).contains(&q.c) && (p == zero || p == Sym::k(k));
                if !fine {
                    return Err(bad(format!(
                        "an index {q} + {p}·b for sample b reaches outside the sample's own \
                         {k} elements of the value held once: not supported"
                    )));
                }
            }
            Ok(g + ti.axis)
        }
        (Some(td), Some(_)) => Err(bad(format!(
            "both are the size of the batch, the data along dimension {} and gathered along \
             {g}: not supported",
            td.axis
        ))),
        (None, None) => Err(c.bad("internal: Gather reads no held value")),
    }
}

/// Where an op's held inputs hold the batch (the output's axis, repeats per sample): the first
/// one's, which every other must share; false for one that does not.
fn agree(held: &mut Option<(usize, usize)>, here: (usize, usize)) -> bool {
    *held.get_or_insert(here) == here
}

/// An elementwise op of held values and others that broadcast along their batch axis (of lower
/// rank, size 1 there, or batched at run time there when the held size is 1): the result's
/// batch axis.
fn elementwise(im: &Importer, c: &Ctx, stepped: bool) -> Result<usize> {
    let ins = &c.n.input;
    let vals: Vec<(usize, Val)> = (0..ins.len())
        .filter_map(|i| im.get(c, i).transpose().map(|v| v.map(|v| (i, v))))
        .collect::<Result<_>>()?;
    let out_rank = vals.iter().map(|(_, v)| v.rank()).max().unwrap_or(0);
    let mut held = None;
    let bad = |why: &str| {
        c.bad(format!(
            "{} of {}: {why}: not supported",
            c.op(),
            ins.iter()
                .filter(|i| !i.is_empty())
                .map(|i| match im.uniform.get(i) {
                    Some(t) => format!(
                        "{i:?} (the size of the batch, held once along dimension {})",
                        t.axis
                    ),
                    None => format!("{i:?}"),
                })
                .collect::<Vec<_>>()
                .join(", ")
        ))
    };
    for (i, v) in &vals {
        if let Some(t) = im.uniform.get(&ins[*i]) {
            let p = out_rank - v.rank() + t.axis;
            if !agree(&mut held, (p, axis_size(c, v, t.axis)?)) {
                return Err(bad("the inputs hold the batch along different axes"));
            }
        }
    }
    let Some((at, k)) = held else {
        return Err(c.bad("internal: elementwise op reads no held value"));
    };
    let mut steps = 0;
    for (i, v) in &vals {
        match im.uniform.get(&ins[*i]) {
            Some(t) => steps += t.step.is_some() as usize,
            None => {
                let s = v.sym_shape().map_err(|e| c.bad(e))?;
                let off = out_rank - s.len();
                for (j, d) in s.iter().enumerate() {
                    let fine = if j + off == at {
                        *d == Sym::k(1) || (*d == BATCH && k == 1 && !stepped)
                    } else {
                        d.is_const()
                    };
                    if !fine {
                        return Err(bad(
                            "another input does not broadcast along the batch axis of the held \
                             value",
                        ));
                    }
                }
            }
        }
    }
    if stepped && (c.op() == "Mul" && steps > 1) {
        return Err(bad("a product of two values that count along the batch"));
    }
    Ok(at)
}

/// The step of node `c`'s result where an input counts along the batch: the op computed
/// again on the inputs' steps (the ops [`check`] admits for them are linear in those
/// inputs; an input without a step adds zeros to a sum and stays as it is in a product).
pub(crate) fn step_of(im: &mut Importer, c: &Ctx) -> Result<Option<Arr<Sym>>> {
    let ins = c.n.input.clone();
    let step = |im: &Importer, n: &str| im.uniform.get(n).and_then(|t| t.step.clone());
    if !ins.iter().any(|n| step(im, n).is_some()) {
        return Ok(None);
    }
    let op = c.op();
    if op == "Shape" || (op == "Gather" && step(im, &ins[0]).is_none()) {
        // A Gather by counting indices is the held value again (`gather` checked it).
        return Ok(None);
    }
    let sum = matches!(op, "Add" | "Sub" | "Concat");
    let data: Vec<usize> = match op {
        "Add" | "Sub" | "Mul" | "Concat" => (0..ins.len()).collect(),
        _ => vec![0],
    };
    let mut swapped = Vec::new();
    for i in data {
        let name = &ins[i];
        if name.is_empty() {
            continue;
        }
        let by = match (step(im, name), im.vals.get(name)) {
            (Some(s), _) => Val::I(s),
            (None, Some(Val::I(a))) if sum => {
                Val::I(Arr::new(a.shape.clone(), vec![Sym::k(0); a.data.len()]))
            }
            (None, Some(_)) if sum => {
                return Err(c.bad(format!(
                    "{op} of integers that count along the batch and {name:?}, which is not \
                     an integer: not supported"
                )))
            }
            _ => continue,
        };
        if let Some(old) = im.vals.insert(name.clone(), by) {
            swapped.push((name.clone(), old));
        }
    }
    let r = im.dispatch(c);
    for (name, old) in swapped {
        im.vals.insert(name, old);
    }
    match r?.into_iter().next() {
        Some(Val::I(a)) => Ok(Some(a)),
        _ => Err(c.bad("internal: the step of integers counting along the batch is not integers")),
    }
}
