//! The CUDA lowering of the `resize` family (its engine home: isolane-engine's `ops/resize.rs`).
//! Resize.

use crate::plan::*;

impl Planner<'_> {
    /// Lowers `Op::Resize(r)`.
    pub(in crate::plan) fn lower_resize(
        &mut self,
        c: &NodeCtx,
        r: &ResizeAttrs,
    ) -> Result<Lowered> {
        let p = self;
        let (name, in_shapes, outs, out_shape, x0) =
            (c.name, &c.in_shapes, &c.outs, &c.out_shape, c.x0);
        let xl = p.raw(x0, name)?;
        let keep = p.nhwc[x0];
        let y = p.output(outs[0], keep);
        let x_shape = four(&in_shapes[0], name)?;
        let out_hw = [out_shape[2], out_shape[3]];
        let (coord, nearest) = resize_codes(r);
        p.push(
            name,
            StepKind::Resize(ResizeStep {
                x: xl,
                y,
                x_shape,
                out_hw,
                linear: r.mode == ResizeMode::Linear,
                coord,
                nearest,
                scales: r.coord_scales([x_shape[2], x_shape[3]], out_hw),
                nhwc: keep,
            }),
        );
        Ok(Lowered::Steps)
    }
}
