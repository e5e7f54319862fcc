//! Elementwise ops: `Op::Unary` (also the fused epilogues of Conv and Linear), `Op::Binary`
//! (numpy broadcasting) and `Op::Identity`.
//!
//! ONNX: the arithmetic, activation and variadic (Max, Min, Sum, Mean) op types, Clip in
//! both signatures, Identity and Dropout; on values known at import they are computed there.

use crate::error::Result;
use crate::ir::{broadcast_shapes, shape_err, Binary, Node};
use crate::ir::{Op, Unary};
use crate::kernels::{bcast_strides, BinaryK, Kernel};
use crate::onnx::fold::{self, Arr, Sym};
use crate::onnx::import::{fmt_syms, Ctx, Importer, Val};
use crate::onnx::Result as OnnxResult;
use crate::ops::ImportFn;

/// The shape rule of `Op::Binary`: the numpy broadcast of the two inputs.
pub(crate) fn infer_binary(n: &Node, ins: &[&[usize]]) -> Result<Vec<usize>> {
    broadcast_shapes(ins[0], ins[1]).ok_or_else(|| {
        shape_err(
            n,
            format!("cannot broadcast {:?} with {:?}", ins[0], ins[1]),
        )
    })
}

/// The CPU kernel of `Op::Binary(b)` writing an output of shape `o`.
pub(crate) fn prepare_binary(ins: &[&[usize]], o: &[usize], b: Binary) -> Kernel {
    Kernel::Binary(BinaryK {
        op: b,
        out_shape: o.to_vec(),
        a_st: bcast_strides(ins[0], o),
        b_st: bcast_strides(ins[1], o),
        same: ins[0] == o && ins[1] == o,
    })
}

/// The ONNX op types imported as elementwise ops.
pub(crate) const ONNX: &[(&str, ImportFn)] = &[
    ("Identity", import_identity),
    ("Dropout", import_dropout),
    ("Add", import_arithmetic),
    ("Sub", import_arithmetic),
    ("Mul", import_arithmetic),
    ("Div", import_arithmetic),
    ("Pow", import_arithmetic),
    ("Max", import_variadic),
    ("Min", import_variadic),
    ("Sum", import_variadic),
    ("Mean", import_variadic),
    ("Relu", import_unary),
    ("PRelu", import_prelu),
    ("Sigmoid", import_unary),
    ("Tanh", import_unary),
    ("Exp", import_unary),
    ("Log", import_unary),
    ("Sqrt", import_unary),
    ("Erf", import_unary),
    ("Neg", import_unary),
    ("Abs", import_unary),
    ("Reciprocal", import_unary),
    ("HardSwish", import_unary),
    ("Floor", import_unary),
    ("Ceil", import_unary),
    ("Sin", import_unary),
    ("Cos", import_unary),
    ("HardSigmoid", import_hard_sigmoid),
    ("LeakyRelu", import_leaky_relu),
    ("Clip", import_clip),
    ("Gelu", import_gelu),
];

fn import_identity(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    Ok(vec![im.req(c, 0)?])
}

fn import_dropout(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    c.ignore("seed");
    // Before opset 12 the ratio is an attribute: it only matters in training.
    c.ignore("ratio");
    if c.int("is_test", 1)? == 0 {
        return Err(c.unsupported_attr("is_test", "value 0 (training)"));
    }
    if let Some(t) = im.get(c, 2)? {
        let on = match &t {
            Val::B(a) => a.data.iter().any(|&b| b),
            _ => true,
        };
        if on {
            return Err(c.bad("training_mode must be a constant false for inference"));
        }
    }
    Ok(vec![im.req(c, 0)?])
}

fn import_arithmetic(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    let b = match c.op() {
        "Add" => Binary::Add,
        "Sub" => Binary::Sub,
        "Mul" => Binary::Mul,
        "Div" => Binary::Div,
        _ => Binary::Pow,
    };
    let (x, y) = (im.req(c, 0)?, im.req(c, 1)?);
    let (n0, n1) = (&c.n.input[0], &c.n.input[1]);
    let (x, y) = if b == Binary::Mul {
        // A scaled-down integer accumulator's factor moves into the other operand.
        (
            im.shifted_operand(c, n0, x, n1)?,
            im.shifted_operand(c, n1, y, n0)?,
        )
    } else {
        ((n0.clone(), x), (n1.clone(), y))
    };
    im.binary(c, b, x, y, 0)
}

fn import_variadic(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    im.variadic(c, c.op())
}

fn import_unary(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    im.unary(c, c.op())
}

fn import_hard_sigmoid(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    let alpha = c.float("alpha", 0.2)?;
    let beta = c.float("beta", 0.5)?;
    im.emit1(c, Op::Unary(Unary::HardSigmoid { alpha, beta }), 1)
}

fn import_leaky_relu(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    let alpha = c.float("alpha", 0.01)?;
    im.emit1(c, Op::Unary(Unary::LeakyRelu { alpha }), 1)
}

/// PRelu: `x` where `x ≥ 0`, `slope · x` elsewhere, `slope` broadcast to `x`'s shape
/// (unidirectionally: the output has `x`'s shape). The IR has no PRelu; it imports as
/// `max(x, 0) + slope · min(x, 0)`, exact in f32 since one of the two terms is zero.
fn import_prelu(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    let x = im.req(c, 0)?;
    let slope = im.req(c, 1)?;
    let (xs, ss) = (
        x.sym_shape().map_err(|e| c.bad(e))?,
        slope.sym_shape().map_err(|e| c.bad(e))?,
    );
    let fits = ss.len() <= xs.len()
        && ss
            .iter()
            .rev()
            .zip(xs.iter().rev())
            .all(|(s, d)| (s.is_const() && s.c == 1) || s == d);
    if !fits {
        return Err(c.bad(format!(
            "slope of shape {} does not broadcast to the input's shape {} (PRelu's output has \
             the input's shape)",
            fmt_syms(&ss),
            fmt_syms(&xs)
        )));
    }
    let node = c.r.node.clone();
    let x = (c.n.input[0].clone(), x);
    let zero = (
        format!("{node}:prelu_zero"),
        Val::F(Arr::new(vec![], vec![0.0])),
    );
    let pos = im.binary(c, Binary::Max, x.clone(), zero.clone(), 1)?;
    let neg = im.binary(c, Binary::Min, x, zero, 1)?;
    let one = |v: Vec<Val>| {
        v.into_iter()
            .next()
            .ok_or_else(|| c.bad("internal: no value"))
    };
    let slope = (c.n.input[1].clone(), slope);
    let scaled = im.binary(
        c,
        Binary::Mul,
        (format!("{node}:negative"), one(neg)?),
        slope,
        1,
    )?;
    im.binary(
        c,
        Binary::Add,
        (format!("{node}:positive"), one(pos)?),
        (format!("{node}:scaled"), one(scaled)?),
        0,
    )
}

/// Clip's bounds are attributes before opset 11, inputs since.
fn import_clip(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    if im.m.opset < 11 {
        im.clip_v6(c)
    } else {
        im.clip(c)
    }
}

/// Gelu entered the default domain at opset 20 (`approximate`: "none" or "tanh").
fn import_gelu(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    if im.m.opset < 20 {
        return Err(c.unsupported_op());
    }
    let u = match c.string("approximate", "none")?.as_str() {
        "none" => Unary::Gelu,
        "tanh" => Unary::GeluTanh,
        other => {
            return Err(c.unsupported_attr(
                "approximate",
                format!("value {other:?} (none and tanh are supported)"),
            ))
        }
    };
    im.emit1(c, Op::Unary(u), 1)
}

impl Importer<'_> {
    /// Elementwise binary op: folded when both sides are known, else an IR node.
    pub(crate) fn binary(
        &mut self,
        c: &Ctx,
        b: Binary,
        x: (String, Val),
        y: (String, Val),
        k: usize,
    ) -> OnnxResult<Vec<Val>> {
        let folded = match (&x.1, &y.1) {
            (Val::F(p), Val::F(q)) => Some(
                fold::zip(p, q, |u, v| {
                    Ok(match b {
                        Binary::Add => u + v,
                        Binary::Sub => u - v,
                        Binary::Mul => u * v,
                        Binary::Div => u / v,
                        Binary::Pow => u.powf(*v),
                        Binary::Max => u.max(*v),
                        Binary::Min => u.min(*v),
                    })
                })
                .map(Val::F),
            ),
            (Val::I(p), Val::I(q)) => Some(
                fold::zip(p, q, |u, v| match b {
                    Binary::Add => u.add(*v),
                    Binary::Sub => u.sub(*v),
                    Binary::Mul => u.mul(*v),
                    Binary::Div => u.div(*v),
                    Binary::Max => u.max(*v),
                    Binary::Min => u.min(*v),
                    Binary::Pow => Err("integer Pow is not supported".into()),
                })
                .map(Val::I),
            ),
            _ => None,
        };
        if let Some(r) = folded {
            return Ok(vec![r.map_err(|e| c.bad(e))?]);
        }
        let out = if k == 0 {
            self.out_name(c, 0)
        } else {
            self.fresh += 1;
            format!("{}:partial{}", c.r.node, self.fresh)
        };
        self.emit(c, Op::Binary(b), &[x, y], vec![out])
    }

    /// Max, Min, Sum and Mean take any number of inputs: a chain of binary ops.
    pub(crate) fn variadic(&mut self, c: &Ctx, op: &str) -> OnnxResult<Vec<Val>> {
        let b = match op {
            "Max" => Binary::Max,
            "Min" => Binary::Min,
            _ => Binary::Add,
        };
        let n = c.n.input.len();
        let first = self.req(c, 0)?; // before indexing: a node with no inputs is an error
        let mut acc = (c.n.input[0].clone(), first);
        for i in 1..n {
            let y = (c.n.input[i].clone(), self.req(c, i)?);
            // The last op of the chain gets the node's output name (unless Mean scales after).
            let last = i == n - 1 && op != "Mean";
            let v = self.binary(c, b, acc, y, if last { 0 } else { i })?;
            self.fresh += 1;
            acc = (
                format!("{}:acc{}", c.r.node, self.fresh),
                v.into_iter().next().ok_or_else(|| c.bad("no output"))?,
            );
        }
        if op == "Mean" && n > 1 {
            let k = (
                format!("{}:1/n", c.r.node),
                Val::F(Arr::scalar(1.0 / n as f32)),
            );
            return self.binary(c, Binary::Mul, acc, k, 0);
        }
        Ok(vec![acc.1])
    }

    pub(crate) fn unary(&mut self, c: &Ctx, op: &str) -> OnnxResult<Vec<Val>> {
        let x = self.req(c, 0)?;
        // Fold on known floats: shape arithmetic (e.g. 1/sqrt(head_dim) in attention) needs the
        // value at import; on integers only the exact ops.
        let f: Option<fn(f32) -> f32> = match op {
            "Relu" => Some(|v| v.max(0.0)),
            "Neg" => Some(|v| -v),
            "Abs" => Some(f32::abs),
            "Sqrt" => Some(f32::sqrt),
            "Reciprocal" => Some(|v| 1.0 / v),
            "Exp" => Some(f32::exp),
            "Log" => Some(f32::ln),
            "Floor" => Some(f32::floor),
            "Ceil" => Some(f32::ceil),
            "Tanh" => Some(f32::tanh),
            "Sigmoid" => Some(|v| 1.0 / (1.0 + (-v).exp())),
            // Positional encodings computed from constants (edgenext's Fourier features).
            "Sin" => Some(f32::sin),
            "Cos" => Some(f32::cos),
            _ => None,
        };
        match (&x, f) {
            (Val::F(a), Some(f)) => return Ok(vec![Val::F(a.map(|&v| f(v)))]),
            (Val::I(a), _) if matches!(op, "Neg" | "Abs" | "Relu" | "Floor" | "Ceil") => {
                let r = a.try_map(|s| match op {
                    "Neg" => Sym::k(0).sub(*s),
                    "Floor" | "Ceil" => Ok(*s),
                    _ if !s.is_const() => Err("Abs/Relu of a batch-dependent value".into()),
                    "Abs" => {
                        s.c.checked_abs()
                            .map(Sym::k)
                            .ok_or_else(|| "overflow".into())
                    }
                    _ => Ok(Sym::k(s.c.max(0))),
                });
                return Ok(vec![Val::I(r.map_err(|e| c.bad(e))?)]);
            }
            _ => {}
        }
        let u = match op {
            "Relu" => Unary::Relu,
            "Sigmoid" => Unary::Sigmoid,
            "Tanh" => Unary::Tanh,
            "Exp" => Unary::Exp,
            "Log" => Unary::Log,
            "Sqrt" => Unary::Sqrt,
            "Erf" => Unary::Erf,
            "Neg" => Unary::Neg,
            "Abs" => Unary::Abs,
            "Reciprocal" => Unary::Reciprocal,
            "HardSwish" => Unary::HardSwish,
            _ => {
                return Err(c.bad(format!(
                    "{op} is supported only on values known at import, not on {}",
                    x.kind()
                )))
            }
        };
        self.emit1(c, Op::Unary(u), 1)
    }

    pub(crate) fn clip(&mut self, c: &Ctx) -> OnnxResult<Vec<Val>> {
        let bound = |v: Option<Val>, what: &str| -> OnnxResult<Option<f32>> {
            match v {
                None => Ok(None),
                Some(Val::F(a)) if a.data.len() == 1 => Ok(Some(a.data[0])),
                Some(v) => Err(c.bad(format!(
                    "{what} must be a float scalar known at import, is {}",
                    v.kind()
                ))),
            }
        };
        let min = bound(self.get(c, 1)?, "min")?.unwrap_or(f32::NEG_INFINITY);
        let max = bound(self.get(c, 2)?, "max")?.unwrap_or(f32::INFINITY);
        let x = self.req(c, 0)?;
        if let Val::F(a) = x {
            return Ok(vec![Val::F(a.map(|&v| v.max(min).min(max)))]);
        }
        // Exact special cases keep the backends' fused activations simple.
        let u = if min == 0.0 && max == 6.0 {
            Unary::Relu6
        } else if min == 0.0 && max == f32::INFINITY {
            Unary::Relu
        } else {
            Unary::Clip { min, max }
        };
        let out = self.out_name(c, 0);
        self.emit(c, Op::Unary(u), &[(c.n.input[0].clone(), x)], vec![out])
    }

    /// Clip before opset 11: `min` and `max` are attributes whose defaults are the lowest and
    /// the largest float (not ±infinity: an infinite input is clipped to them).
    pub(crate) fn clip_v6(&mut self, c: &Ctx) -> OnnxResult<Vec<Val>> {
        let min = c.float("min", f32::MIN)?;
        let max = c.float("max", f32::MAX)?;
        let inputs = vec![
            (1, Some(Val::F(Arr::scalar(min)))),
            (2, Some(Val::F(Arr::scalar(max)))),
        ];
        self.as_newer_form(c, inputs, &["min", "max"], vec![], Self::clip)
    }
}
