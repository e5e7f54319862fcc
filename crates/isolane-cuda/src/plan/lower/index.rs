//! The CUDA lowering of the `index` family (its engine home: isolane-engine's `ops/index.rs`).
//! Concat, Split, Slice and Gather (those that are not views, `shape::lower_view`): strided copies.

use crate::plan::*;

impl Planner<'_> {
    /// Lowers `Op::Concat { axis }`.
    pub(in crate::plan) fn lower_concat(&mut self, c: &NodeCtx, axis: &i64) -> Result<Lowered> {
        let p = self;
        let (n, name, in_shapes, outs, out_shape) =
            (c.n, c.name, &c.in_shapes, &c.outs, &c.out_shape);
        let a = norm_axis(*axis, out_shape.len()).ok_or_else(|| unsupported(name, "bad axis"))?;
        let ys = contiguous_strides(out_shape);
        let xl: Vec<Loc> = n
            .inputs
            .iter()
            .map(|&i| p.raw(i, name))
            .collect::<Result<_>>()?;
        let y = p.output(outs[0], false);
        let mut at = 0;
        for (j, s) in in_shapes.iter().enumerate() {
            let sx = phys_strides(s, p.nhwc[n.inputs[j]]);
            let to = y.with_offset(at * ys[a]);
            p.push_copy(name, [xl[j], to], s, [ys.clone(), sx])?;
            at += s[a];
        }
        Ok(Lowered::Steps)
    }

    /// Lowers `Op::Split { axis, sizes }`.
    pub(in crate::plan) fn lower_split(
        &mut self,
        c: &NodeCtx,
        axis: &i64,
        sizes: &[usize],
    ) -> Result<Lowered> {
        let p = self;
        let (name, in_shapes, outs, x0) = (c.name, &c.in_shapes, &c.outs, c.x0);
        let x = &in_shapes[0];
        let a = norm_axis(*axis, x.len()).ok_or_else(|| unsupported(name, "bad axis"))?;
        let xl = p.raw(x0, name)?;
        let xs = phys_strides(x, p.nhwc[x0]);
        let mut at = 0;
        for (j, &o) in outs.iter().enumerate() {
            let os = p.shapes[o].clone();
            let y = p.output(o, false);
            let from = xl.with_offset(at * xs[a]);
            p.push_copy(name, [from, y], &os, [contiguous_strides(&os), xs.clone()])?;
            at += sizes[j];
        }
        Ok(Lowered::Steps)
    }

    /// Lowers `Op::Slice { starts, ends, axes, steps: st, }`.
    pub(in crate::plan) fn lower_slice(
        &mut self,
        c: &NodeCtx,
        starts: &[i64],
        ends: &[i64],
        axes: &[i64],
        st: &[i64],
    ) -> Result<Lowered> {
        let p = self;
        let (name, in_shapes, outs, out_shape, x0) =
            (c.name, &c.in_shapes, &c.outs, &c.out_shape, c.x0);
        let x = &in_shapes[0];
        let sp = slice_params(x, starts, ends, axes, st).map_err(|e| unsupported(name, e))?;
        let xl = p.raw(x0, name)?;
        let xs = phys_strides(x, p.nhwc[x0]);
        let mut base: i64 = 0;
        let mut src: Vec<usize> = Vec::new();
        for (d, &(s0, step, _)) in sp.iter().enumerate() {
            if step < 0 {
                return Err(unsupported(name, "Slice with a negative step"));
            }
            base += s0 * xs[d] as i64;
            src.push(step as usize * xs[d]);
        }
        let y = p.output(outs[0], false);
        let from = xl.with_offset(base as usize);
        p.push_copy(
            name,
            [from, y],
            out_shape,
            [contiguous_strides(out_shape), src],
        )?;
        Ok(Lowered::Steps)
    }

    /// Lowers `Op::Gather { axis, indices, indices_shape, }`.
    pub(in crate::plan) fn lower_gather(
        &mut self,
        c: &NodeCtx,
        axis: &i64,
        indices: &[i64],
        indices_shape: &[usize],
    ) -> Result<Lowered> {
        let p = self;
        let (name, in_shapes, outs, out_shape, x0) =
            (c.name, &c.in_shapes, &c.outs, &c.out_shape, c.x0);
        let x = &in_shapes[0];
        let a = norm_axis(*axis, x.len()).ok_or_else(|| unsupported(name, "bad axis"))?;
        let xl = p.raw(x0, name)?;
        let xs = phys_strides(x, p.nhwc[x0]);
        let ys = contiguous_strides(out_shape);
        let inner: usize = x[a + 1..].iter().product();
        let mut dims: Vec<usize> = x[..a].to_vec();
        dims.extend_from_slice(&x[a + 1..]);
        let mut sx: Vec<usize> = xs[..a].to_vec();
        sx.extend_from_slice(&xs[a + 1..]);
        let mut sy: Vec<usize> = ys[..a].to_vec();
        sy.extend_from_slice(&ys[a + indices_shape.len()..]);
        let y = p.output(outs[0], false);
        for (j, &ix) in indices.iter().enumerate() {
            let ix = if ix < 0 { ix + x[a] as i64 } else { ix } as usize;
            let (from, to) = (xl.with_offset(ix * xs[a]), y.with_offset(j * inner));
            p.push_copy(name, [from, to], &dims, [sy.clone(), sx.clone()])?;
        }
        Ok(Lowered::Steps)
    }
}
