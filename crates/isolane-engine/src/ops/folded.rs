//! Ops computed at import only: the shape subgraphs exporters emit (Shape, Size, Cast,
//! ConstantOfShape, Range, comparisons, Where, Mod...) become values known at import, with
//! batch-dependent integers carried as `a·B + c`. They have no IR op: a runtime tensor
//! reaching one is refused by name.

use crate::ir::{Op, Unary};
use crate::onnx::fold::{self, Arr, Sym};
use crate::onnx::import::{
    batch_uniform, check_dims_size, fmt_syms, node_axis, static_shape, sym_to_dim, syms_static,
    Ctx, Dyn, Importer, Val,
};
use crate::onnx::proto::{attribute_proto::AttributeType, TensorProto};
use crate::onnx::tensor::{self, Data};
use crate::onnx::{OnnxError, Result as OnnxResult};
use crate::ops::ImportFn;

/// The ONNX op types computed at import.
pub(crate) const ONNX: &[(&str, ImportFn)] = &[
    ("Constant", import_constant),
    ("Shape", import_shape),
    ("Size", import_size),
    ("Cast", import_cast),
    ("CastLike", import_cast_like),
    ("ConstantOfShape", import_constant_of_shape),
    ("Range", import_range),
    ("CumSum", import_cumsum),
    ("Equal", import_compare),
    ("Less", import_compare),
    ("Greater", import_compare),
    ("LessOrEqual", import_compare),
    ("GreaterOrEqual", import_compare),
    ("Not", import_not),
    ("IsNaN", import_is_nan),
    ("OneHot", import_one_hot),
    ("And", import_and_or),
    ("Or", import_and_or),
    ("Where", import_where),
    ("Mod", import_mod),
];

fn import_constant(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    let v = im.constant(c)?;
    im.note_constant_type(c);
    Ok(vec![v])
}

fn import_shape(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    im.shape_op(c)
}

fn import_size(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    let x = im.req(c, 0)?;
    let s = x.sym_shape().map_err(|e| c.bad(e))?;
    let mut p = Sym::k(1);
    for d in s {
        p = p.mul(d).map_err(|e| c.bad(e))?;
    }
    Ok(vec![Val::I(Arr::scalar(p))])
}

fn import_cast(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    let to = c.int("to", 0)?;
    c.ignore("saturate"); // only affects float8 targets, which are rejected below
    let x = im.req(c, 0)?;
    Ok(vec![cast(c, x, to)?])
}

fn import_cast_like(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    c.ignore("saturate");
    let x = im.req(c, 0)?;
    let like = im.req(c, 1)?;
    let to = match like {
        Val::I(_) => 7,
        Val::B(_) => 9,
        _ => 1,
    };
    Ok(vec![cast(c, x, to)?])
}

fn import_constant_of_shape(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    let value = match c.typed("value", AttributeType::Tensor)? {
        None => Val::F(Arr::scalar(0.0)),
        Some(a) => im.tensor_attr(c, "value", a.t.as_ref())?,
    };
    let one_row = batch_uniform::one_row_shape(im, c)?;
    if let (None, Val::I(s), Val::F(v)) = (&one_row, im.req(c, 0)?, &value) {
        if s.data.iter().any(|d| !d.is_const()) && v.data.len() == 1 {
            return im.constant_of_batch_shape(c, &s.data, v.data[0]);
        }
    }
    let shape = match one_row {
        Some(one_row) => one_row,
        None => im
            .ints_input(c, 0, "shape")?
            .ok_or_else(|| c.bad("missing shape input"))?,
    };
    let shape: Vec<usize> = shape
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| c.bad(format!("negative dimension in {shape:?}"))))
        .collect::<OnnxResult<_>>()?;
    let n = match value {
        Val::I(_) => fold::numel_of::<Sym>(&shape),
        Val::B(_) => fold::numel_of::<bool>(&shape),
        _ => fold::numel(&shape),
    }
    .map_err(|e| c.bad(e))?;
    Ok(vec![match value {
        Val::F(a) if a.data.len() == 1 => Val::F(Arr::new(shape, vec![a.data[0]; n])),
        Val::I(a) if a.data.len() == 1 => Val::I(Arr::new(shape, vec![a.data[0]; n])),
        Val::B(a) if a.data.len() == 1 => Val::B(Arr::new(shape, vec![a.data[0]; n])),
        _ => return Err(c.bad("value must hold exactly one element")),
    }])
}

impl Importer<'_> {
    /// A float ConstantOfShape whose shape holds the batch other than as its dimension 0
    /// alone (PyTorch's classic export of `nn.LSTM` builds its zero initial states as
    /// `[layers·dirs, B·rows, hidden]`; timm's Sequencer2D): a runtime Expand of the one value
    /// to that shape, which every backend runs. (`[B, fixed...]` is held with one row instead,
    /// `batch_uniform`, so that integer and bool masks stay values known at import.)
    fn constant_of_batch_shape(&mut self, c: &Ctx, shape: &[Sym], v: f32) -> OnnxResult<Vec<Val>> {
        let dims = shape
            .iter()
            .map(|&s| sym_to_dim(s, false))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| c.bad(format!("shape {}: {e}", fmt_syms(shape))))?;
        check_dims_size(&dims).map_err(|e| c.bad(format!("shape {e}")))?;
        let one = Val::F(Arr::new(vec![1; dims.len()], vec![v]));
        let out = self.out_name(c, 0);
        let ins = [(format!("{}:value", c.r.node), one)];
        self.emit(c, Op::Expand { shape: dims }, &ins, vec![out])
    }
}

fn import_range(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    im.range(c)
}

fn import_cumsum(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    im.cumsum(c)
}

fn import_compare(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    im.compare(c, c.op())
}

fn import_not(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    match im.req(c, 0)? {
        Val::B(a) => Ok(vec![Val::B(a.map(|b| !b))]),
        v => Err(c.bad(format!("Not of {} is not supported", v.kind()))),
    }
}

/// IsNaN: on a float known at import, computed; on a runtime tensor, a test that only
/// `Where(IsNaN(x), c, x)` may read (`Importer::where_op`), since the IR has no bool tensors.
fn import_is_nan(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    match im.req(c, 0)? {
        Val::F(a) => Ok(vec![Val::B(a.map(|v| v.is_nan()))]),
        Val::Dyn(d) => Ok(vec![Val::NanTest(d)]),
        v => Err(c.bad(format!(
            "IsNaN of {} is not supported (its input must be a float tensor)",
            v.kind()
        ))),
    }
}

/// OneHot of indices known at import (timm's GC ViT, classic export, builds its relative
/// position bias so): `depth` classes inserted at `axis`, `values` = [off, on]; a negative
/// index counts from the end, one outside [-depth, depth) selects no class (ONNX).
fn import_one_hot(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    let indices = im.req(c, 0)?;
    let idx: Vec<i64> = match &indices {
        Val::F(a) => a.data.iter().map(|&v| v as i64).collect(),
        v => syms_static(c, v, "indices")?,
    };
    let shape = static_shape(&indices);
    let depth = match im.req(c, 1)? {
        Val::F(a) if a.data.len() == 1 => a.data[0] as i64,
        v => match syms_static(c, &v, "depth")?.as_slice() {
            [d] => *d,
            other => return Err(c.bad(format!("depth {other:?}: expected one value"))),
        },
    };
    if depth < 1 {
        return Err(c.bad(format!("depth {depth}: expected at least 1")));
    }
    let axis = node_axis(c, c.int("axis", -1)?, shape.len() + 1)?;
    let mut out_shape = shape.clone();
    out_shape.insert(axis, depth as usize);
    fold::numel_of::<Sym>(&out_shape).map_err(|e| c.bad(e))?;
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis..].iter().product();
    let hot = |o: usize, k: usize, i: usize| {
        let v = idx[o * inner + i];
        let v = if v < 0 { v + depth } else { v };
        v == k as i64
    };
    let values = im.req(c, 2)?;
    let positions = (0..outer)
        .flat_map(|o| (0..depth as usize).flat_map(move |k| (0..inner).map(move |i| (o, k, i))));
    let r = match values {
        Val::F(v) if v.data.len() == 2 => Val::F(Arr::new(
            out_shape,
            positions
                .map(|(o, k, i)| v.data[hot(o, k, i) as usize])
                .collect(),
        )),
        Val::I(v) if v.data.len() == 2 => Val::I(Arr::new(
            out_shape,
            positions
                .map(|(o, k, i)| v.data[hot(o, k, i) as usize])
                .collect(),
        )),
        v => {
            return Err(c.bad(format!(
                "values is {} of shape {:?}; expected [off, on] known at import",
                v.kind(),
                static_shape(&v)
            )))
        }
    };
    Ok(vec![r])
}

fn import_and_or(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    let (Val::B(a), Val::B(b)) = (im.req(c, 0)?, im.req(c, 1)?) else {
        return Err(c.bad("only constant bool inputs are supported"));
    };
    let and = c.op() == "And";
    Ok(vec![Val::B(
        fold::zip(&a, &b, |x, y| Ok(if and { *x && *y } else { *x || *y }))
            .map_err(|e| c.bad(e))?,
    )])
}

fn import_where(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    im.where_op(c)
}

fn import_mod(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    im.modulo(c)
}

impl Importer<'_> {
    pub(crate) fn constant(&mut self, c: &Ctx) -> OnnxResult<Val> {
        let attrs: Vec<&str> = c.n.attribute.iter().map(|a| a.name()).collect();
        if attrs.len() != 1 {
            return Err(c.bad(format!(
                "expects exactly one value attribute, has {attrs:?}"
            )));
        }
        match attrs[0] {
            "value" => {
                let a = c.typed("value", AttributeType::Tensor)?;
                self.tensor_attr(c, "value", a.and_then(|a| a.t.as_ref()))
            }
            "value_float" => Ok(Val::F(Arr::scalar(c.float("value_float", 0.0)?))),
            "value_floats" => {
                let a = c.typed("value_floats", AttributeType::Floats)?;
                let v = a.map(|a| a.floats.clone()).unwrap_or_default();
                Ok(Val::F(Arr::new(vec![v.len()], v)))
            }
            "value_int" => Ok(Val::I(Arr::scalar(Sym::k(c.int("value_int", 0)?)))),
            "value_ints" => {
                let v = c.ints("value_ints")?.unwrap_or_default();
                Ok(Val::I(Arr::new(
                    vec![v.len()],
                    v.into_iter().map(Sym::k).collect(),
                )))
            }
            other => Err(c.unsupported_attr(
                other,
                "only tensor, float(s) and int(s) constants are supported",
            )),
        }
    }

    pub(crate) fn tensor_attr(
        &self,
        c: &Ctx,
        name: &str,
        t: Option<&TensorProto>,
    ) -> OnnxResult<Val> {
        let t = t.ok_or_else(|| c.bad(format!("attribute {name} holds no tensor")))?;
        let path = self.m.path.clone();
        let mut ext = |t: &TensorProto| tensor::read_external(&path, t);
        let t = tensor::from_proto(t, &mut ext).map_err(|e| {
            c.bad(format!(
                "attribute {name}: {}",
                OnnxError::from_tensor_error(&path, t.name(), e)
            ))
        })?;
        Ok(match t.data {
            Data::F32(v) => Val::F(Arr::new(t.shape, v)),
            Data::I64(v) => Val::I(Arr::new(t.shape, v.into_iter().map(Sym::k).collect())),
            Data::Bool(v) => Val::B(Arr::new(t.shape, v)),
        })
    }

    pub(crate) fn shape_op(&mut self, c: &Ctx) -> OnnxResult<Vec<Val>> {
        let x = self.req(c, 0)?;
        let s = self.real_shape(&c.n.input[0], &x).map_err(|e| c.bad(e))?;
        let r = s.len() as i64;
        let clampi = |v: i64| if v < 0 { (v + r).max(0) } else { v.min(r) };
        let start = clampi(c.int("start", 0)?) as usize;
        let end = clampi(c.int("end", r)?) as usize;
        let part: Vec<Sym> = if start < end {
            s[start..end].to_vec()
        } else {
            vec![]
        };
        Ok(vec![Val::I(Arr::new(vec![part.len()], part))])
    }

    /// CumSum of a float constant (positional encodings are cumulated masks); a runtime
    /// tensor's is not supported.
    pub(crate) fn cumsum(&mut self, c: &Ctx) -> OnnxResult<Vec<Val>> {
        let exclusive = c.int("exclusive", 0)? != 0;
        let reverse = c.int("reverse", 0)? != 0;
        let x = self.req(c, 0)?;
        let axis = syms_static(c, &self.req(c, 1)?, "axis")?;
        let &[axis] = axis.as_slice() else {
            return Err(c.bad(format!("axis must hold one value, holds {}", axis.len())));
        };
        let a = node_axis(c, axis, x.rank())?;
        match x {
            Val::F(arr) => Ok(vec![Val::F(arr.cumsum(a, exclusive, reverse))]),
            other => Err(c.bad(format!(
                "CumSum of {} is not supported (float constants only)",
                other.kind()
            ))),
        }
    }

    pub(crate) fn range(&mut self, c: &Ctx) -> OnnxResult<Vec<Val>> {
        let (s, l, d) = (self.req(c, 0)?, self.req(c, 1)?, self.req(c, 2)?);
        match (&s, &l, &d) {
            (Val::I(_), Val::I(_), Val::I(_)) => {
                let v = |x: &Val| {
                    syms_static(c, x, "Range bound").map(|v| v.first().copied().unwrap_or(0))
                };
                let (s, l, d) = (v(&s)?, v(&l)?, v(&d)?);
                if d == 0 {
                    return Err(c.bad("delta is 0"));
                }
                let n = ((l as f64 - s as f64) / d as f64).ceil().max(0.0) as usize;
                fold::numel_of::<Sym>(&[n]).map_err(|e| c.bad(e))?;
                let data = (0..n as i64)
                    .map(|i| i.checked_mul(d).and_then(|v| v.checked_add(s)).map(Sym::k))
                    .collect::<Option<_>>()
                    .ok_or_else(|| c.bad("Range overflows int64"))?;
                Ok(vec![Val::I(Arr::new(vec![n], data))])
            }
            (Val::F(a), Val::F(b), Val::F(e))
                if a.data.len() == 1 && b.data.len() == 1 && e.data.len() == 1 =>
            {
                let (s, l, d) = (a.data[0], b.data[0], e.data[0]);
                if d == 0.0 || !d.is_finite() {
                    return Err(c.bad("delta is 0"));
                }
                let n = ((l - s) / d).ceil().max(0.0) as usize;
                fold::numel(&[n]).map_err(|e| c.bad(e))?;
                let data = (0..n).map(|i| s + i as f32 * d).collect();
                Ok(vec![Val::F(Arr::new(vec![n], data))])
            }
            _ => Err(c.bad("Range needs scalar bounds known at import")),
        }
    }

    pub(crate) fn compare(&mut self, c: &Ctx, op: &str) -> OnnxResult<Vec<Val>> {
        let (x, y) = (self.req(c, 0)?, self.req(c, 1)?);
        let r = match (&x, &y) {
            (Val::I(a), Val::I(b)) => fold::zip(a, b, |p, q| {
                Ok(match op {
                    "Equal" => p.equal(*q)?,
                    "Less" => p.less(*q)?,
                    "Greater" => q.less(*p)?,
                    "LessOrEqual" => !q.less(*p)?,
                    _ => !p.less(*q)?,
                })
            }),
            (Val::F(a), Val::F(b)) => fold::zip(a, b, |p, q| {
                Ok(match op {
                    "Equal" => p == q,
                    "Less" => p < q,
                    "Greater" => p > q,
                    "LessOrEqual" => p <= q,
                    _ => p >= q,
                })
            }),
            (Val::B(a), Val::B(b)) if op == "Equal" => fold::zip(a, b, |p, q| Ok(p == q)),
            _ => {
                return Err(c.bad(format!(
                    "{op} of {} and {} is not supported (only on values known at import)",
                    x.kind(),
                    y.kind()
                )))
            }
        };
        Ok(vec![Val::B(r.map_err(|e| c.bad(e))?)])
    }

    pub(crate) fn where_op(&mut self, c: &Ctx) -> OnnxResult<Vec<Val>> {
        let (cond, x, y) = (self.req(c, 0)?, self.req(c, 1)?, self.req(c, 2)?);
        if let Val::NanTest(tested) = &cond {
            return self.where_nan(c, tested, &x, &y);
        }
        let Val::B(cond) = cond else {
            return Err(c.bad(format!(
                "the condition is {}; isolane folds Where only on values known at import",
                cond.kind()
            )));
        };
        let r = match (&x, &y) {
            (Val::I(a), Val::I(b)) => fold::select(&cond, a, b).map(Val::I),
            (Val::F(a), Val::F(b)) => fold::select(&cond, a, b).map(Val::F),
            (Val::B(a), Val::B(b)) => fold::select(&cond, a, b).map(Val::B),
            _ => {
                return Err(c.bad(format!(
                    "Where on {} and {} is not supported (only on values known at import)",
                    x.kind(),
                    y.kind()
                )))
            }
        };
        Ok(vec![r.map_err(|e| c.bad(e))?])
    }

    /// `Where(IsNaN(x), v, x)`: x with its NaN replaced by the constant v. PyTorch's ONNX export
    /// of scaled_dot_product_attention (torch.onnx's dynamo exporter; every Hugging Face
    /// attention model) writes it after the attention Softmax, so that a fully masked row (all
    /// -inf, a Softmax of NaN) gives zeros. A Softmax's values lie in [0, 1], so for v <= 0 it
    /// is `Clip(x, v, +inf)`: unchanged where x is a number, and v where x is NaN, since Clip's
    /// lower bound is taken with max(), which returns the number of a (NaN, number) pair on
    /// every backend (Rust's f32::max, CUDA's fmaxf). Any other use is refused by name.
    fn where_nan(&mut self, c: &Ctx, tested: &Dyn, x: &Val, y: &Val) -> OnnxResult<Vec<Val>> {
        let refuse = |why: String| {
            Err(c.bad(format!(
                "Where(IsNaN(x), v, x) is supported only as PyTorch's attention export writes it: \
                 x a Softmax output, v a constant <= 0; {why}"
            )))
        };
        let same = matches!(y, Val::Dyn(d) if d.id == tested.id);
        if !same {
            return refuse(format!(
                "here the value taken where no NaN is ({}) is not the tested tensor",
                y.kind()
            ));
        }
        let value = match x {
            Val::F(a) if a.data.len() == 1 => a.data[0],
            other => {
                return refuse(format!(
                    "here the replacement is {} of shape {:?}",
                    other.kind(),
                    static_shape(other)
                ))
            }
        };
        if value.is_nan() || value > 0.0 {
            return refuse(format!("here the replacement is {value}"));
        }
        let producer = self.g.producer(tested.id).map(|n| &self.g.nodes[n].op);
        if !matches!(producer, Some(Op::Softmax { .. })) {
            let what = producer.map_or("a graph input or constant", |op| op.name());
            return refuse(format!("here x comes from {what}"));
        }
        let clip = Op::Unary(Unary::Clip {
            min: value,
            max: f32::INFINITY,
        });
        let out = self.out_name(c, 0);
        self.emit(c, clip, &[(c.n.input[2].clone(), y.clone())], vec![out])
    }

    /// Mod, on values known at import (exporters use it for axis arithmetic such as
    /// `-1 % rank` in `unflatten`). `fmod=0`: the result takes the divisor's sign (Python);
    /// `fmod=1`: the dividend's (C `fmod`).
    pub(crate) fn modulo(&mut self, c: &Ctx) -> OnnxResult<Vec<Val>> {
        let fmod = c.int("fmod", 0)? != 0;
        let (x, y) = (self.req(c, 0)?, self.req(c, 1)?);
        let r = match (&x, &y) {
            (Val::I(a), Val::I(b)) => fold::zip(a, b, |p, q| {
                if !p.is_const() || !q.is_const() {
                    return Err("Mod of a batch-dependent value".into());
                }
                if q.c == 0 {
                    return Err("Mod by zero".into());
                }
                let r = p.c.checked_rem(q.c).ok_or("overflow")?;
                Ok(Sym::k(if !fmod && r != 0 && (r < 0) != (q.c < 0) { r + q.c } else { r }))
            })
            .map(Val::I),
            (Val::F(a), Val::F(b)) if fmod => fold::zip(a, b, |p, q| Ok(p % q)).map(Val::F),
            _ => {
                return Err(c.bad(format!(
                    "Mod of {} and {} is supported only on integers known at import (floats need fmod=1)",
                    x.kind(),
                    y.kind()
                )))
            }
        };
        Ok(vec![r.map_err(|e| c.bad(e))?])
    }
}

/// ONNX Cast to data type `to` (TensorProto.DataType numbers).
pub(crate) fn cast(c: &Ctx, x: Val, to: i64) -> OnnxResult<Val> {
    const FLOAT: i64 = 1;
    const DOUBLE: i64 = 11;
    const FLOAT16: i64 = 10;
    const BFLOAT16: i64 = 16;
    const BOOL: i64 = 9;
    const INTS: [i64; 8] = [2, 3, 4, 5, 6, 7, 12, 13];
    let float_target = matches!(to, FLOAT | DOUBLE | FLOAT16 | BFLOAT16);
    Ok(match x {
        // Runtime tensors are f32 in the IR and computed at the precision the model is compiled
        // for (`--precision`), so a cast between float types (the Cast to/from float16 that an
        // fp16-converted model has at its input and output) is a pass-through: it names a
        // storage type, and the backend's precision decides the rounding (docs/onnx.md).
        // A cast to an integer type would change values and is not supported.
        Val::Dyn(_) if float_target => x,
        Val::Dyn(_) => {
            return Err(c.bad(format!(
                "casting a runtime tensor to data type {to} is not supported"
            )))
        }
        // A value known at import is rounded exactly as the cast asks (e.g. a float16 constant).
        Val::F(a) if to == FLOAT16 => Val::F(a.map(|&v| half::f16::from_f32(v).to_f32())),
        Val::F(a) if to == BFLOAT16 => Val::F(a.map(|&v| half::bf16::from_f32(v).to_f32())),
        Val::F(a) if float_target => Val::F(a),
        Val::F(a) if to == BOOL => Val::B(a.map(|&v| v != 0.0)),
        // Float → integer truncates toward zero (C semantics, as onnxruntime).
        Val::F(a) if INTS.contains(&to) => Val::I(a.map(|&v| Sym::k(v.trunc() as i64))),
        Val::I(a) if float_target => {
            let v = a
                .try_map(|s| {
                    if s.is_const() {
                        Ok(s.c as f32)
                    } else {
                        Err("cast of a batch-dependent value to float".into())
                    }
                })
                .map_err(|e| c.bad(e))?;
            Val::F(v)
        }
        Val::I(a) if INTS.contains(&to) => Val::I(a),
        Val::I(a) if to == BOOL => Val::B(
            a.try_map(|s| s.equal(Sym::k(0)).map(|z| !z))
                .map_err(|e| c.bad(e))?,
        ),
        Val::B(a) if float_target => Val::F(a.map(|&b| b as i32 as f32)),
        Val::B(a) if INTS.contains(&to) => Val::I(a.map(|&b| Sym::k(b as i64))),
        Val::B(a) if to == BOOL => Val::B(a),
        _ => return Err(c.unsupported_attr("to", format!("data type {to}"))),
    })
}

#[cfg(test)]
mod tests {
    use crate::ops::testing::{floats, node, run, with_int};

    /// PyTorch's dynamo export of scaled_dot_product_attention (every Hugging Face ViT, DeiT,
    /// BEiT, DINOv2, CLIP...) writes `Where(IsNaN(Softmax(s)), 0, Softmax(s))`: refused as
    /// "unsupported op IsNaN". A fully masked row (all -inf) gives zeros, as onnxruntime's.
    #[test]
    fn the_attention_exports_nan_guard_after_a_softmax_runs() {
        let nodes = vec![
            with_int(node("Softmax", &["x"], "s"), "axis", -1),
            node("IsNaN", &["s"], "nan"),
            node("Where", &["nan", "zero", "s"], "y"),
        ];
        let inf = f32::NEG_INFINITY;
        let x = [inf, inf, inf, 1.0, 2.0, 3.0];
        let y = run(nodes, vec![floats("zero", &[], &[0.0])], &[1, 2, 3], &x).unwrap();
        assert_eq!(y.shape, vec![1, 2, 3]);
        assert_eq!(&y.data[..3], &[0.0; 3]);
        let e: Vec<f32> = [1.0f32, 2.0, 3.0].iter().map(|v| v.exp()).collect();
        let sum: f32 = e.iter().sum();
        for (got, want) in y.data[3..].iter().zip(&e) {
            assert!((got - want / sum).abs() < 1e-6, "{got} vs {}", want / sum);
        }
    }

    /// What the rewrite does not cover is refused by name and why, never run wrongly.
    #[test]
    fn other_nan_guards_are_refused_saying_what_is_supported() {
        let softmax = || with_int(node("Softmax", &["x"], "s"), "axis", -1);
        let cases = [
            // Not after a Softmax: x may be below the replacement.
            (
                vec![
                    node("IsNaN", &["x"], "nan"),
                    node("Where", &["nan", "zero", "x"], "y"),
                ],
                0.0,
                "x comes from a graph input",
            ),
            // A replacement above a Softmax's smallest value.
            (
                vec![
                    softmax(),
                    node("IsNaN", &["s"], "nan"),
                    node("Where", &["nan", "zero", "s"], "y"),
                ],
                0.5,
                "the replacement is 0.5",
            ),
            // The value kept is another tensor than the one tested.
            (
                vec![
                    softmax(),
                    node("IsNaN", &["s"], "nan"),
                    node("Where", &["nan", "zero", "x"], "y"),
                ],
                0.0,
                "not the tested tensor",
            ),
            // The mask read by anything but Where.
            (
                vec![
                    softmax(),
                    node("IsNaN", &["s"], "nan"),
                    node("Relu", &["nan"], "y"),
                ],
                0.0,
                "IsNaN of a runtime tensor",
            ),
        ];
        for (nodes, zero, want) in cases {
            let e = run(
                nodes,
                vec![floats("zero", &[], &[zero])],
                &[1, 3],
                &[1.0, 2.0, 3.0],
            )
            .unwrap_err();
            assert!(e.contains(want), "{e}");
        }
    }

    /// IsNaN of a constant is computed at import.
    #[test]
    fn is_nan_of_a_constant_is_folded() {
        let nodes = vec![
            node("IsNaN", &["k"], "nan"),
            node("Where", &["nan", "zero", "k"], "kept"),
            node("Add", &["x", "kept"], "y"),
        ];
        let inits = vec![
            floats("k", &[2], &[f32::NAN, 2.0]),
            floats("zero", &[], &[0.0]),
        ];
        let y = run(nodes, inits, &[1, 2], &[1.0, 1.0]).unwrap();
        assert_eq!(y.data, vec![1.0, 3.0]);
    }
}

#[cfg(test)]
mod one_hot_tests {
    use crate::ops::testing::{floats, ints, node, run, with_int};

    /// timm's GC ViT (classic export) builds its relative position bias with a OneHot of
    /// constants: refused as "unsupported op OneHot". Checked as onnxruntime defines it:
    /// negative indices count from the end, and the class axis goes where `axis` says.
    #[test]
    fn a_one_hot_of_constants_is_computed_at_import() {
        let nodes = |axis: i64| {
            vec![
                with_int(
                    node("OneHot", &["idx", "depth", "values"], "hot"),
                    "axis",
                    axis,
                ),
                node("Add", &["x", "hot"], "y"),
            ]
        };
        let inits = || {
            vec![
                ints("idx", &[2], &[2, -3]),
                ints("depth", &[], &[3]),
                floats("values", &[2], &[0.0, 5.0]),
            ]
        };
        // Classes last: [[0, 0, 5], [5, 0, 0]].
        let y = run(nodes(-1), inits(), &[2, 3], &[0.0; 6]).unwrap();
        assert_eq!(y.data, vec![0.0, 0.0, 5.0, 5.0, 0.0, 0.0]);
        // Classes first: the transpose, [[0, 5], [0, 0], [5, 0]].
        let y = run(nodes(0), inits(), &[3, 2], &[0.0; 6]).unwrap();
        assert_eq!(y.data, vec![0.0, 5.0, 0.0, 0.0, 5.0, 0.0]);
    }
}
