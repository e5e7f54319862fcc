//! Ops that pick or join parts of tensors: `Op::Concat`, `Op::Split`, `Op::Slice` (ONNX
//! semantics, negative steps included) and `Op::Gather` (constant indices).
//!
//! ONNX: Concat, Split, Slice (both signatures), Gather, GatherND, ScatterND, ScatterElements
//! and Pad.

use crate::error::Result;
use crate::ir::{self, Dim, Op};
use crate::ir::{norm_axis, shape_err, slice_params, Node};
use crate::kernels::{strides_of, unsupported, Kernel, StridedK};
use crate::onnx::fold::{self, Arr, Sym};
use crate::onnx::import::{
    check_pads, concat_known, fmt_syms, map_arr, node_axis, static_shape, sym_to_dim, syms_static,
    Ctx, Importer, Val,
};
use crate::onnx::Result as OnnxResult;
use crate::ops::ImportFn;

/// The shape rule of `Op::Split { axis, sizes }`, the one op with several outputs.
pub(crate) fn infer_split(
    n: &Node,
    x: &[usize],
    axis: i64,
    sizes: &[usize],
) -> Result<Vec<Vec<usize>>> {
    let err = |m: String| shape_err(n, m);
    let a = norm_axis(axis, x.len())
        .ok_or_else(|| err(format!("axis {axis} out of range for {x:?}")))?;
    if sizes.iter().sum::<usize>() != x[a] {
        return Err(err(format!("split sizes {sizes:?} do not sum to {}", x[a])));
    }
    Ok(sizes
        .iter()
        .map(|&s| {
            let mut o = x.to_vec();
            o[a] = s;
            o
        })
        .collect())
}

/// The shape rule of `Op::Slice { .. }`.
pub(crate) fn infer_slice(
    n: &Node,
    x: &[usize],
    starts: &[i64],
    ends: &[i64],
    axes: &[i64],
    steps: &[i64],
) -> Result<Vec<usize>> {
    let p = slice_params(x, starts, ends, axes, steps).map_err(|m| shape_err(n, m))?;
    Ok(p.iter().map(|t| t.2).collect())
}

/// The shape rule of `Op::Concat { axis }`.
pub(crate) fn infer_concat(n: &Node, ins: &[&[usize]], axis: &i64) -> Result<Vec<usize>> {
    let err = |m: String| shape_err(n, m);
    let x = ins.first().copied().unwrap_or(&[]);
    let shape = {
        let a = norm_axis(*axis, x.len())
            .ok_or_else(|| err(format!("axis {axis} out of range for {x:?}")))?;
        let mut o = x.to_vec();
        o[a] = 0;
        for s in ins {
            if s.len() != x.len() || s.iter().enumerate().any(|(i, &d)| i != a && d != x[i]) {
                return Err(err(format!("cannot concat {s:?} with {x:?} on axis {a}")));
            }
            o[a] = o[a]
                .checked_add(s[a])
                .ok_or_else(|| err(format!("concatenating {s:?} on axis {a} passes usize")))?;
        }
        o
    };
    Ok(shape)
}

/// The shape rule of `Op::Gather { axis, indices, indices_shape, }`.
pub(crate) fn infer_gather(
    n: &Node,
    ins: &[&[usize]],
    axis: &i64,
    indices: &[i64],
    indices_shape: &[usize],
) -> Result<Vec<usize>> {
    let err = |m: String| shape_err(n, m);
    let x = ins.first().copied().unwrap_or(&[]);
    let shape = {
        let a = norm_axis(*axis, x.len())
            .ok_or_else(|| err(format!("axis {axis} out of range for {x:?}")))?;
        if indices_shape.iter().product::<usize>() != indices.len() {
            return Err(err("indices do not fit indices_shape".into()));
        }
        let d = x[a] as i64;
        if let Some(bad) = indices.iter().find(|&&i| i < -d || i >= d) {
            return Err(err(format!("index {bad} out of range for dim of size {d}")));
        }
        let mut o = x[..a].to_vec();
        o.extend_from_slice(indices_shape);
        o.extend_from_slice(&x[a + 1..]);
        o
    };
    Ok(shape)
}

/// The CPU kernel of `Op::Slice { starts, ends, axes, steps, }`.
pub(crate) fn prepare_slice(
    node: &Node,
    ins: &[&[usize]],
    outs: &[&[usize]],
    starts: &[i64],
    ends: &[i64],
    axes: &[i64],
    steps: &[i64],
) -> Result<Kernel> {
    let x = ins[0];
    let o = outs[0];
    let kernel = {
        let p = slice_params(x, starts, ends, axes, steps).map_err(|m| unsupported(node, m))?;
        let st = strides_of(x);
        let base: i64 = p
            .iter()
            .zip(&st)
            .map(|(t, &s)| if t.2 > 0 { t.0 * s as i64 } else { 0 })
            .sum();
        Kernel::Strided(StridedK {
            out_shape: o.to_vec(),
            strides: p
                .iter()
                .zip(&st)
                .map(|(t, &s)| (t.1 * s as i64) as isize)
                .collect(),
            base: base as isize,
        })
    };
    Ok(kernel)
}

/// The CPU kernel of `Op::Concat { axis }`.
pub(crate) fn prepare_concat(node: &Node, ins: &[&[usize]], axis: i64) -> Result<Kernel> {
    let x = ins[0];
    let a = norm_axis(axis, x.len()).ok_or_else(|| unsupported(node, "axis"))?;
    Ok(Kernel::Concat {
        outer: x[..a].iter().product(),
        chunks: ins.iter().map(|s| s[a..].iter().product()).collect(),
    })
}

/// The CPU kernel of `Op::Split { axis, .. }`.
pub(crate) fn prepare_split(
    node: &Node,
    x: &[usize],
    outs: &[&[usize]],
    axis: i64,
) -> Result<Kernel> {
    let a = norm_axis(axis, x.len()).ok_or_else(|| unsupported(node, "axis"))?;
    Ok(Kernel::Split {
        outer: x[..a].iter().product(),
        chunks: outs.iter().map(|s| s[a..].iter().product()).collect(),
    })
}

/// The CPU kernel of `Op::Gather { axis, indices, .. }` (negative indices count from the end).
pub(crate) fn prepare_gather(
    node: &Node,
    x: &[usize],
    axis: i64,
    indices: &[i64],
) -> Result<Kernel> {
    let a = norm_axis(axis, x.len()).ok_or_else(|| unsupported(node, "axis"))?;
    let d = x[a] as i64;
    Ok(Kernel::Gather {
        outer: x[..a].iter().product(),
        dim: x[a],
        inner: x[a + 1..].iter().product(),
        indices: indices
            .iter()
            .map(|&i| if i < 0 { (i + d) as usize } else { i as usize })
            .collect(),
    })
}

/// The ONNX op types imported as ops that pick, join or pad parts of tensors.
pub(crate) const ONNX: &[(&str, ImportFn)] = &[
    ("Concat", import_concat),
    ("Split", import_split),
    ("Slice", import_slice),
    ("Gather", import_gather),
    ("GatherND", import_gather_nd),
    ("ScatterND", import_scatter_nd),
    ("ScatterElements", import_scatter_elements),
    ("Pad", import_pad),
];

fn import_concat(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    im.concat(c)
}

/// Split's sizes are an attribute before opset 13, an input since.
fn import_split(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    if im.m.opset < 13 {
        im.split_v2(c)
    } else {
        im.split(c)
    }
}

/// Slice's starts, ends and axes are attributes before opset 10, inputs since.
fn import_slice(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    if im.m.opset < 10 {
        im.slice_v1(c)
    } else {
        im.slice(c)
    }
}

fn import_gather(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    im.gather(c)
}

fn import_gather_nd(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    im.gather_nd(c)
}

fn import_scatter_nd(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    im.scatter_nd(c)
}

fn import_scatter_elements(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    im.scatter_elements(c)
}

/// Pad's amounts are an attribute before opset 11, an input since.
fn import_pad(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    if im.m.opset < 11 {
        im.pad_v2(c)
    } else {
        im.pad(c)
    }
}

impl Importer<'_> {
    pub(crate) fn concat(&mut self, c: &Ctx) -> OnnxResult<Vec<Val>> {
        let axis = c.int("axis", i64::MIN)?;
        if axis == i64::MIN {
            return Err(c.bad("attribute axis is required"));
        }
        let mut vals = Vec::new();
        for i in 0..c.n.input.len() {
            if let Some(v) = self.get(c, i)? {
                vals.push((c.n.input[i].clone(), v));
            }
        }
        let first = vals.first().ok_or_else(|| c.bad("no inputs"))?.1.clone();
        let a = node_axis(c, axis, first.rank())?;
        if vals.iter().any(|(_, v)| v.is_dyn()) {
            let out = self.out_name(c, 0);
            // Empty constant pieces (e.g. a torch shape list with nothing to add) drop out.
            vals.retain(|(_, v)| v.is_dyn() || !static_shape(v).contains(&0));
            return self.emit(c, Op::Concat { axis }, &vals, vec![out]);
        }
        let r = match &first {
            Val::I(_) => concat_known(c, &vals, a, |v| match v {
                Val::I(x) => Some(x),
                _ => None,
            })
            .map(Val::I),
            Val::F(_) => concat_known(c, &vals, a, |v| match v {
                Val::F(x) => Some(x),
                _ => None,
            })
            .map(Val::F),
            _ => concat_known(c, &vals, a, |v| match v {
                Val::B(x) => Some(x),
                _ => None,
            })
            .map(Val::B),
        };
        Ok(vec![r?])
    }

    pub(crate) fn split(&mut self, c: &Ctx) -> OnnxResult<Vec<Val>> {
        let axis = c.int("axis", 0)?;
        let num_outputs = if self.m.opset >= 18 {
            c.int("num_outputs", 0)?
        } else {
            0
        };
        let x = self.req(c, 0)?;
        let a = node_axis(c, axis, x.rank())?;
        let d = x.sym_shape().map_err(|e| c.bad(e))?[a];
        if !d.is_const() {
            return Err(c.bad("splitting along the batch dimension is not supported"));
        }
        let d = d.c as usize;
        let n_out = c.n.output.len();
        let sizes: Vec<usize> = match self.ints_input(c, 1, "split")? {
            Some(s) => s
                .iter()
                .map(|&v| usize::try_from(v).map_err(|_| c.bad(format!("negative split {s:?}"))))
                .collect::<OnnxResult<_>>()?,
            None => {
                let n = if num_outputs > 0 {
                    num_outputs as usize
                } else {
                    n_out
                };
                if n == 0 {
                    return Err(c.bad("no outputs"));
                }
                // Checked before the parts are listed: a huge num_outputs must not allocate.
                if n != n_out {
                    return Err(c.bad(format!(
                        "num_outputs = {num_outputs}, but the node has {n_out} outputs"
                    )));
                }
                // ONNX: equal parts of ceil(d/n), the last one smaller if d is not divisible.
                let part = d.div_ceil(n);
                (0..n)
                    .map(|i| part.min(d.saturating_sub(i * part)))
                    .collect()
            }
        };
        if sizes.iter().sum::<usize>() != d || sizes.len() != n_out {
            return Err(c.bad(format!(
                "split sizes {sizes:?} do not cover dimension {a} of size {d} with {n_out} outputs"
            )));
        }
        if let Val::Dyn(_) = x {
            let outs = (0..n_out).map(|i| self.out_name(c, i)).collect();
            let ins = [(c.n.input[0].clone(), x)];
            return self.emit(c, Op::Split { axis, sizes }, &ins, outs);
        }
        let s = static_shape(&x);
        let mut outs = Vec::new();
        let mut start = 0i64;
        for &sz in &sizes {
            let mut p: Vec<(i64, i64, usize)> = s.iter().map(|&d| (0, 1, d)).collect();
            p[a] = (start, 1, sz);
            start += sz as i64;
            outs.push(map_arr(
                c,
                x.clone(),
                |t| t.slice(&p),
                |t| t.slice(&p),
                |t| t.slice(&p),
            )?);
        }
        Ok(outs)
    }

    pub(crate) fn slice(&mut self, c: &Ctx) -> OnnxResult<Vec<Val>> {
        let x = self.req(c, 0)?;
        let starts = self
            .ints_input(c, 1, "starts")?
            .ok_or_else(|| c.bad("missing starts"))?;
        let ends = self
            .ints_input(c, 2, "ends")?
            .ok_or_else(|| c.bad("missing ends"))?;
        let axes = self.ints_input(c, 3, "axes")?.unwrap_or_default();
        let steps = self.ints_input(c, 4, "steps")?.unwrap_or_default();
        if let Val::Dyn(d) = &x {
            // Bounds on the batch axis would have to be the same at every batch size.
            let r = d.shapes[0].len();
            let ax: Vec<i64> = if axes.is_empty() {
                (0..starts.len() as i64).collect()
            } else {
                axes.clone()
            };
            for k in 0..2 {
                ir::slice_params(&d.shapes[k], &starts, &ends, &ax, &steps)
                    .map_err(|e| c.bad(e))?;
            }
            let batch_dims: Vec<usize> = (0..r)
                .filter(|&i| d.shapes[0][i] != d.shapes[1][i])
                .collect();
            for (i, &a) in ax.iter().enumerate() {
                let a = node_axis(c, a, r)?;
                let full = starts[i] == 0
                    && ends[i] >= i32::MAX as i64
                    && steps.get(i).is_none_or(|&s| s == 1);
                if batch_dims.contains(&a) && !full {
                    return Err(c.bad("slicing the batch dimension is not supported"));
                }
            }
            return self.emit1(
                c,
                Op::Slice {
                    starts,
                    ends,
                    axes: ax,
                    steps,
                },
                1,
            );
        }
        let s = static_shape(&x);
        let p = ir::slice_params(&s, &starts, &ends, &axes, &steps).map_err(|e| c.bad(e))?;
        Ok(vec![map_arr(
            c,
            x,
            |t| t.slice(&p),
            |t| t.slice(&p),
            |t| t.slice(&p),
        )?])
    }

    pub(crate) fn gather(&mut self, c: &Ctx) -> OnnxResult<Vec<Val>> {
        let axis = c.int("axis", 0)?;
        let x = self.req(c, 0)?;
        let idx = self.req(c, 1)?;
        let Val::I(ia) = &idx else {
            return Err(c.bad(format!(
                "the indices are {}; isolane supports Gather with indices known at import",
                idx.kind()
            )));
        };
        let indices: Vec<i64> = syms_static(c, &idx, "indices")?;
        let ishape = ia.shape.clone();
        let r = x.rank();
        let a = node_axis(c, axis, r)?;
        let dim = x.sym_shape().map_err(|e| c.bad(e))?[a];
        if let Val::Dyn(_) = x {
            if !dim.is_const() && indices.iter().any(|&i| i < 0) {
                return Err(c.bad("negative indices along the batch dimension are not supported"));
            }
            return self.emit1(
                c,
                Op::Gather {
                    axis,
                    indices,
                    indices_shape: ishape,
                },
                1,
            );
        }
        let d = dim.c;
        let norm: Vec<usize> = indices
            .iter()
            .map(|&i| {
                let j = if i < 0 { i + d } else { i };
                if j < 0 || j >= d {
                    Err(c.bad(format!(
                        "index {i} is out of range for a dimension of size {d}"
                    )))
                } else {
                    Ok(j as usize)
                }
            })
            .collect::<OnnxResult<_>>()?;
        Ok(vec![map_arr(
            c,
            x,
            |t| t.gather(a, &norm, &ishape),
            |t| t.gather(a, &norm, &ishape),
            |t| t.gather(a, &norm, &ishape),
        )?])
    }

    /// GatherND on values known at import (`batch_dims` 0): swin v2's relative position bias
    /// table, computed from constants, indexed by a constant index.
    pub(crate) fn gather_nd(&mut self, c: &Ctx) -> OnnxResult<Vec<Val>> {
        c.int_default_only("batch_dims", 0)?;
        let (data, indices) = (self.req(c, 0)?, self.req(c, 1)?);
        if let Val::Dyn(_) = &data {
            return self.gather_nd_runtime(c, data, &indices);
        }
        // Integer and bool data too: DETR's dynamo export picks its pixel mask's rows (a bool
        // resized at import) so.
        Ok(vec![match &data {
            Val::F(a) => Val::F(gather_nd_known(c, a, &indices)?),
            Val::I(a) => Val::I(gather_nd_known(c, a, &indices)?),
            Val::B(a) => Val::B(gather_nd_known(c, a, &indices)?),
            other => {
                return Err(c.bad(format!(
                    "GatherND of {} is supported only on values known at import and runtime \
                     tensors",
                    other.kind()
                )))
            }
        }])
    }

    /// GatherND of a runtime tensor by indices known at import: one Gather along dimension 0
    /// of the data with its indexed dimensions flattened into one (a Reshape first when there
    /// are several). Transformers' BEiT picks its relative position bias so, from a table
    /// that PyTorch's dynamo exporter leaves as a Resize of a constant (a runtime tensor here
    /// until constants are folded).
    fn gather_nd_runtime(&mut self, c: &Ctx, data: Val, indices: &Val) -> OnnxResult<Vec<Val>> {
        let shape = data.sym_shape().map_err(|e| c.bad(e))?;
        let (idx, ishape, q) = nd_indices(c, indices, &static_shape(&data))?;
        if shape[..q].iter().any(|s| !s.is_const()) {
            return Err(c.bad(format!(
                "GatherND indexing the batch dimension of a runtime tensor (data {}, indices \
                 {ishape:?}) is not supported",
                fmt_syms(&shape)
            )));
        }
        let indexed: Vec<usize> = shape[..q].iter().map(|s| s.c as usize).collect();
        let mut rows = Vec::with_capacity(idx.len() / q);
        for tuple in idx.chunks_exact(q) {
            rows.push(nd_offset(c, tuple, &indexed)? as i64);
        }
        let mut x = data;
        if q > 1 {
            let mut flat = vec![Dim::Fixed(indexed.iter().product())];
            for &s in &shape[q..] {
                flat.push(sym_to_dim(s, false).map_err(|e| c.bad(e))?);
            }
            let name = c.n.input[0].clone();
            x = self.emit_tmp(c, Op::Reshape { shape: flat }, &[(name, x)], "rows")?;
        }
        let gather = Op::Gather {
            axis: 0,
            indices: rows,
            indices_shape: ishape[..ishape.len() - 1].to_vec(),
        };
        let out = self.out_name(c, 0);
        self.emit(c, gather, &[(c.n.input[0].clone(), x)], vec![out])
    }

    /// ScatterND on values known at import (`reduction` none), of any element type: the masks
    /// and biases that exporters build from in-place slice assignments (swin v2's
    /// shifted-window mask; BEiT's relative position index, integers).
    pub(crate) fn scatter_nd(&mut self, c: &Ctx) -> OnnxResult<Vec<Val>> {
        let reduction = c.string("reduction", "none")?;
        if reduction != "none" {
            return Err(c.unsupported_attr("reduction", format!("value {reduction:?}")));
        }
        let (data, indices, updates) = (self.req(c, 0)?, self.req(c, 1)?, self.req(c, 2)?);
        let dshape = static_shape(&data);
        let (idx, ishape, q) = nd_indices(c, &indices, &dshape)?;
        let slice: usize = dshape[q..].iter().product();
        let n = idx.len() / q;
        let mut offsets = Vec::with_capacity(n);
        for tuple in idx.chunks_exact(q) {
            offsets.push(nd_offset(c, tuple, &dshape)? * slice);
        }
        let fits = |len: usize| {
            if len == n * slice {
                Ok(())
            } else {
                Err(c.bad(format!(
                    "updates {:?} do not fit indices {ishape:?} into data {dshape:?}",
                    static_shape(&updates)
                )))
            }
        };
        fn put<T: Clone>(data: &Arr<T>, updates: &[T], offsets: &[usize], slice: usize) -> Arr<T> {
            let mut out = data.data.clone();
            for (k, &at) in offsets.iter().enumerate() {
                out[at..at + slice].clone_from_slice(&updates[k * slice..(k + 1) * slice]);
            }
            Arr::new(data.shape.clone(), out)
        }
        let r = match (&data, &updates) {
            (Val::F(d), Val::F(u)) => {
                fits(u.data.len()).map(|_| Val::F(put(d, &u.data, &offsets, slice)))
            }
            (Val::I(d), Val::I(u)) => {
                fits(u.data.len()).map(|_| Val::I(put(d, &u.data, &offsets, slice)))
            }
            (Val::B(d), Val::B(u)) => {
                fits(u.data.len()).map(|_| Val::B(put(d, &u.data, &offsets, slice)))
            }
            _ => Err(c.bad(format!(
                "ScatterND of {} with updates {} is supported only on values known at import, \
                 of one element type",
                data.kind(),
                updates.kind()
            ))),
        }?;
        Ok(vec![r])
    }

    /// ScatterElements (reduction `none`) on values known at import, of any element type:
    /// PyTorch's dynamo exporter writes BEiT's relative position index (a `select_scatter` of
    /// integers) with it. `indices` and `updates` have one shape; each update goes to its own
    /// position with the index along `axis` replaced.
    pub(crate) fn scatter_elements(&mut self, c: &Ctx) -> OnnxResult<Vec<Val>> {
        let reduction = c.string("reduction", "none")?;
        if reduction != "none" {
            return Err(c.unsupported_attr("reduction", format!("value {reduction:?}")));
        }
        let (data, indices, updates) = (self.req(c, 0)?, self.req(c, 1)?, self.req(c, 2)?);
        let dshape = static_shape(&data);
        let axis = node_axis(c, c.int("axis", 0)?, dshape.len())?;
        let idx = syms_static(c, &indices, "indices")?;
        let ishape = static_shape(&indices);
        if ishape != static_shape(&updates)
            || ishape.len() != dshape.len()
            || ishape
                .iter()
                .zip(&dshape)
                .enumerate()
                .any(|(d, (&i, &n))| d != axis && i > n)
        {
            return Err(c.bad(format!(
                "indices {ishape:?} and updates {:?} do not scatter into data {dshape:?} \
                 along axis {axis}",
                static_shape(&updates)
            )));
        }
        // Each update's flat position in data: its own coordinates, the one on `axis` replaced.
        let mut offsets = Vec::with_capacity(idx.len());
        let mut coord = vec![0usize; ishape.len()];
        for &i in &idx {
            let size = dshape[axis] as i64;
            let j = if i < 0 { i + size } else { i };
            if !(0..size).contains(&j) {
                return Err(c.bad(format!(
                    "index {i} is out of range for axis {axis} of size {size}"
                )));
            }
            let mut at = 0usize;
            for (d, &k) in coord.iter().enumerate() {
                at = at * dshape[d] + if d == axis { j as usize } else { k };
            }
            offsets.push(at);
            for d in (0..coord.len()).rev() {
                coord[d] += 1;
                if coord[d] < ishape[d] {
                    break;
                }
                coord[d] = 0;
            }
        }
        fn put<T: Clone>(data: &Arr<T>, updates: &[T], offsets: &[usize]) -> Arr<T> {
            let mut out = data.data.clone();
            for (&at, u) in offsets.iter().zip(updates) {
                out[at] = u.clone();
            }
            Arr::new(data.shape.clone(), out)
        }
        let r = match (&data, &updates) {
            (Val::F(d), Val::F(u)) => Val::F(put(d, &u.data, &offsets)),
            (Val::I(d), Val::I(u)) => Val::I(put(d, &u.data, &offsets)),
            (Val::B(d), Val::B(u)) => Val::B(put(d, &u.data, &offsets)),
            _ => {
                return Err(c.bad(format!(
                    "ScatterElements of {} with updates {} is supported only on values known \
                     at import, of one element type",
                    data.kind(),
                    updates.kind()
                )))
            }
        };
        Ok(vec![r])
    }

    /// Pad (opsets 13–21: `pads`, `constant_value` and, from 18, `axes` as inputs; modes
    /// constant, reflect, edge and, from 19, wrap) as existing IR ops, one padded axis at a
    /// time: negative pads are a Slice; the new borders are a constant broadcast with Expand
    /// (constant) or rows of the input picked with Gather (reflect, edge, wrap), joined with
    /// Concat. All-zero pads (what exporters write for sizes that need none) vanish.
    pub(crate) fn pad(&mut self, c: &Ctx) -> OnnxResult<Vec<Val>> {
        let mode = c.string("mode", "constant")?;
        let known = matches!(mode.as_str(), "constant" | "reflect" | "edge")
            || (mode == "wrap" && self.m.opset >= 19);
        if !known {
            return Err(c.unsupported_attr("mode", format!("value {mode:?}")));
        }
        let x = self.req(c, 0)?;
        let pads = self
            .ints_input(c, 1, "pads")?
            .ok_or_else(|| c.bad("the pads input is required"))?;
        let value = match self.get(c, 2)? {
            None => 0.0,
            Some(Val::F(a)) if a.data.len() <= 1 => a.data.first().copied().unwrap_or(0.0),
            Some(v) => {
                return Err(c.bad(format!(
                    "constant_value must be a float scalar known at import, is {}",
                    v.kind()
                )))
            }
        };
        let r = x.rank();
        let axes: Vec<usize> = match self.ints_input(c, 3, "axes")? {
            None => (0..r).collect(),
            Some(a) => a
                .iter()
                .map(|&v| node_axis(c, v, r))
                .collect::<OnnxResult<_>>()?,
        };
        if pads.len() != 2 * axes.len() {
            return Err(c.bad(format!(
                "pads {pads:?} needs 2 values per padded axis ({} axes)",
                axes.len()
            )));
        }
        if pads.iter().all(|&p| p == 0) {
            return Ok(vec![x]);
        }
        if !x.is_dyn() {
            return Err(c.bad(format!(
                "Pad of {} is not supported (only runtime tensors)",
                x.kind()
            )));
        }
        let xs = x.sym_shape().map_err(|e| c.bad(e))?;
        check_pads(&xs, &axes, &pads).map_err(|e| c.bad(e))?;
        let mut cur = (c.n.input[0].clone(), x);
        for (k, &ax) in axes.iter().enumerate() {
            let (before, after) = (pads[k], pads[k + axes.len()]);
            if before == 0 && after == 0 {
                continue;
            }
            if !xs[ax].is_const() {
                return Err(c.bad(format!(
                    "pads {pads:?} pad axis {ax}, whose size depends on the batch"
                )));
            }
            let v = self.pad_axis(c, cur, ax, [before, after], &mode, value)?;
            self.fresh += 1;
            cur = (format!("{}:padded{}", c.r.node, self.fresh), v);
        }
        Ok(vec![cur.1])
    }

    /// Pads one axis of `x` by `[before, after]` (negative: cropped) in `mode`.
    pub(crate) fn pad_axis(
        &mut self,
        c: &Ctx,
        x: (String, Val),
        ax: usize,
        [before, after]: [i64; 2],
        mode: &str,
        value: f32,
    ) -> OnnxResult<Val> {
        let mut x = x;
        let n = static_shape(&x.1)[ax] as i64;
        if before < 0 || after < 0 {
            let (start, end) = (before.min(0).abs(), n - after.min(0).abs());
            if start >= end {
                return Err(c.bad(format!("pads crop axis {ax} of size {n} to nothing")));
            }
            let op = Op::Slice {
                starts: vec![start],
                ends: vec![end],
                axes: vec![ax as i64],
                steps: vec![1],
            };
            let v = self.emit_tmp(c, op, &[x], "cropped")?;
            x = (format!("{}:cropped", c.r.node), v);
        }
        let n = static_shape(&x.1)[ax] as i64;
        let shape = x.1.sym_shape().map_err(|e| c.bad(e))?;
        let mut pieces = Vec::new();
        for (is_before, p) in [(true, before.max(0)), (false, after.max(0))] {
            if p == 0 {
                continue;
            }
            let indices: Vec<i64> = match mode {
                "constant" => vec![],
                "edge" => vec![if is_before { 0 } else { n - 1 }; p as usize],
                "reflect" if p < n => {
                    if is_before {
                        (1..=p).rev().collect()
                    } else {
                        (0..p).map(|i| n - 2 - i).collect()
                    }
                }
                "wrap" if p <= n => {
                    if is_before {
                        (n - p..n).collect()
                    } else {
                        (0..p).collect()
                    }
                }
                _ => {
                    return Err(c.bad(format!(
                        "{mode} padding of {p} on axis {ax} of size {n} (must be smaller than the axis)"
                    )))
                }
            };
            let piece = if mode == "constant" {
                let mut dims = Vec::with_capacity(shape.len());
                for (i, &d) in shape.iter().enumerate() {
                    let d = if i == ax { Sym::k(p) } else { d };
                    dims.push(sym_to_dim(d, false).map_err(|e| c.bad(format!("pad: {e}")))?);
                }
                self.fresh += 1;
                let fill = (
                    format!("{}:fill{}", c.r.node, self.fresh),
                    Val::F(Arr::new(vec![1; shape.len()], vec![value])),
                );
                self.emit_tmp(c, Op::Expand { shape: dims }, &[fill], "border")?
            } else {
                let op = Op::Gather {
                    axis: ax as i64,
                    indices_shape: vec![indices.len()],
                    indices,
                };
                self.emit_tmp(c, op, std::slice::from_ref(&x), "border")?
            };
            self.fresh += 1;
            pieces.push((
                is_before,
                (format!("{}:border{}", c.r.node, self.fresh), piece),
            ));
        }
        let mut ins: Vec<(String, Val)> = pieces
            .iter()
            .filter(|(b, _)| *b)
            .map(|(_, v)| v.clone())
            .collect();
        ins.push(x);
        ins.extend(pieces.into_iter().filter(|(b, _)| !*b).map(|(_, v)| v));
        self.emit_tmp(c, Op::Concat { axis: ax as i64 }, &ins, "joined")
    }

    /// Split before opset 13: the part sizes are the `split` attribute (absent: equal parts).
    pub(crate) fn split_v2(&mut self, c: &Ctx) -> OnnxResult<Vec<Val>> {
        let inputs = match c.ints("split")? {
            Some(s) => vec![(
                1,
                Some(Val::I(Arr::new(
                    vec![s.len()],
                    s.into_iter().map(Sym::k).collect(),
                ))),
            )],
            None => vec![],
        };
        self.as_newer_form(c, inputs, &["split"], vec![], Self::split)
    }

    /// Slice before opset 10: `starts`, `ends` and `axes` are attributes (no steps).
    pub(crate) fn slice_v1(&mut self, c: &Ctx) -> OnnxResult<Vec<Val>> {
        let ints_val =
            |v: Vec<i64>| Val::I(Arr::new(vec![v.len()], v.into_iter().map(Sym::k).collect()));
        let starts = c
            .ints("starts")?
            .ok_or_else(|| c.bad("attribute starts is required"))?;
        let ends = c
            .ints("ends")?
            .ok_or_else(|| c.bad("attribute ends is required"))?;
        let mut inputs = vec![(1, Some(ints_val(starts))), (2, Some(ints_val(ends)))];
        if let Some(axes) = c.ints("axes")? {
            inputs.push((3, Some(ints_val(axes))));
        }
        self.as_newer_form(c, inputs, &["starts", "ends", "axes"], vec![], Self::slice)
    }

    /// Pad before opset 11: `pads` and `value` are attributes; `mode` is unchanged.
    pub(crate) fn pad_v2(&mut self, c: &Ctx) -> OnnxResult<Vec<Val>> {
        let pads = c
            .ints("pads")?
            .ok_or_else(|| c.bad("attribute pads is required"))?;
        let value = c.float("value", 0.0)?;
        let pads = Val::I(Arr::new(
            vec![pads.len()],
            pads.into_iter().map(Sym::k).collect(),
        ));
        let inputs = vec![(1, Some(pads)), (2, Some(Val::F(Arr::scalar(value))))];
        self.as_newer_form(c, inputs, &["pads", "value"], vec![], Self::pad)
    }
}

/// GatherND (`batch_dims` 0) of `data` known at import by `indices` known there.
fn gather_nd_known<T: Clone>(c: &Ctx, data: &Arr<T>, indices: &Val) -> OnnxResult<Arr<T>> {
    let dshape = &data.shape;
    let (idx, ishape, q) = nd_indices(c, indices, dshape)?;
    let slice: usize = dshape[q..].iter().product();
    let mut shape = ishape[..ishape.len() - 1].to_vec();
    shape.extend_from_slice(&dshape[q..]);
    // Every index tuple copies a whole slice: a few indices into a large constant make an
    // output far larger than either, so its size is checked before it is allocated.
    let n = fold::numel_of::<T>(&shape).map_err(|e| c.bad(e))?;
    let mut out = Vec::with_capacity(n);
    for tuple in idx.chunks_exact(q) {
        let at = nd_offset(c, tuple, dshape)? * slice;
        out.extend_from_slice(&data.data[at..at + slice]);
    }
    Ok(Arr::new(shape, out))
}

/// The C-order offset (in units of the trailing slice) of an index tuple into the leading dims
/// of `shape` (negative indices count from the end), for GatherND and ScatterND.
/// GatherND's and ScatterND's `indices` (known at import) for data of shape `dshape`: their
/// values, their shape, and `q`, the length of the index tuples along their last axis
/// (1 to the rank of the data).
pub(crate) fn nd_indices(
    c: &Ctx,
    indices: &Val,
    dshape: &[usize],
) -> OnnxResult<(Vec<i64>, Vec<usize>, usize)> {
    let idx = syms_static(c, indices, "indices")?;
    let ishape = static_shape(indices);
    let q = ishape.last().copied().unwrap_or(0);
    if q == 0 || q > dshape.len() {
        return Err(c.bad(format!("indices {ishape:?} do not index data {dshape:?}")));
    }
    Ok((idx, ishape, q))
}

pub(crate) fn nd_offset(c: &Ctx, tuple: &[i64], shape: &[usize]) -> OnnxResult<usize> {
    let mut offset = 0usize;
    for (d, &i) in tuple.iter().enumerate() {
        let size = shape[d] as i64;
        let j = if i < 0 { i + size } else { i };
        if !(0..size).contains(&j) {
            return Err(c.bad(format!(
                "index {i} is out of range for dimension {d} of size {size}"
            )));
        }
        offset = offset * shape[d] + j as usize;
    }
    Ok(offset)
}

#[cfg(test)]
mod scatter_gather_tests {
    use crate::ops::testing::{import, ints, node, run, with_int};

    /// BEiT's relative position index, exported by the dynamo exporter, is a ScatterElements
    /// of integers (refused as an unsupported op), and by the classic one a ScatterND of
    /// integers (refused: "supported only on float values known at import").
    #[test]
    fn integer_scatters_known_at_import_are_computed() {
        let x: Vec<f32> = (0..8).map(|v| v as f32 * 10.0).collect();
        // ScatterElements along axis 1: [[0,0],[0,0]] gets 5 at (0,1) and 6 at (1,0).
        let nodes = vec![
            with_int(
                node("ScatterElements", &["data", "at", "upd"], "idx"),
                "axis",
                1,
            ),
            with_int(node("Gather", &["x", "idx"], "y"), "axis", 1),
        ];
        let inits = vec![
            ints("data", &[2, 2], &[0, 0, 0, 0]),
            ints("at", &[2, 1], &[1, 0]),
            ints("upd", &[2, 1], &[5, 6]),
        ];
        let y = run(nodes, inits, &[1, 8], &x).unwrap();
        assert_eq!(y.shape, vec![1, 2, 2]);
        assert_eq!(y.data, vec![0.0, 50.0, 60.0, 0.0]);
        // ScatterND: [0,0,0] gets 2 at [1].
        let nodes = vec![
            node("ScatterND", &["data", "at", "upd"], "idx"),
            with_int(node("Gather", &["x", "idx"], "y"), "axis", 1),
        ];
        let inits = vec![
            ints("data", &[3], &[0, 0, 0]),
            ints("at", &[1, 1], &[1]),
            ints("upd", &[1], &[2]),
        ];
        assert_eq!(
            run(nodes, inits, &[1, 8], &x).unwrap().data,
            vec![0.0, 20.0, 0.0]
        );
        // An index past the axis is refused by name.
        let nodes = vec![
            with_int(
                node("ScatterElements", &["data", "at", "upd"], "idx"),
                "axis",
                0,
            ),
            with_int(node("Gather", &["x", "idx"], "y"), "axis", 1),
        ];
        let inits = vec![
            ints("data", &[3], &[0, 0, 0]),
            ints("at", &[1], &[3]),
            ints("upd", &[1], &[2]),
        ];
        let e = run(nodes, inits, &[1, 8], &x).unwrap_err();
        assert!(
            e.contains("ScatterElements") && e.contains("index 3 is out of range"),
            "{e}"
        );
    }

    /// BEiT's bias table picked by GatherND from a runtime tensor (dynamo: a Resize of a
    /// constant): refused as "supported only on float values known at import".
    #[test]
    fn gather_nd_of_a_runtime_tensor_by_constant_indices_is_a_gather() {
        let x: Vec<f32> = (0..6).map(|v| v as f32).collect();
        // x [1,3,2] → t [3,2,1]: t[i][j] = x[0][i][j].
        let t = || {
            let mut n = node("Transpose", &["x"], "t");
            n.attribute.push(crate::onnx::proto::AttributeProto {
                name: Some("perm".into()),
                ints: vec![1, 2, 0],
                r#type: Some(crate::onnx::proto::attribute_proto::AttributeType::Ints as i32),
                ..Default::default()
            });
            n
        };
        // Two indexed dimensions: a Reshape, then a Gather.
        let nodes = vec![t(), node("GatherND", &["t", "at"], "y")];
        let y = run(
            nodes,
            vec![ints("at", &[2, 2], &[2, 1, 0, -1])],
            &[1, 3, 2],
            &x,
        )
        .unwrap();
        assert_eq!(y.shape, vec![2, 1]);
        assert_eq!(y.data, vec![5.0, 1.0]);
        // One: a Gather alone.
        let nodes = vec![t(), node("GatherND", &["t", "at"], "y")];
        let y = run(nodes, vec![ints("at", &[2, 1], &[2, 0])], &[1, 3, 2], &x).unwrap();
        assert_eq!(y.shape, vec![2, 2, 1]);
        assert_eq!(y.data, vec![4.0, 5.0, 0.0, 1.0]);
        // Indexing the batch dimension (of any size) is refused by name.
        let nodes = vec![node("GatherND", &["x", "at"], "y")];
        let e = import(nodes, vec![ints("at", &[1, 1], &[0])], &[1, 3, 2], true).unwrap_err();
        assert!(e.contains("GatherND indexing the batch dimension"), "{e}");
    }
}
