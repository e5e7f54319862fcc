//! The CUDA lowering of the `reduce` family (its engine home: isolane-engine's `ops/reduce.rs`).
//! Softmax and the Reduce ops.

use crate::plan::*;

impl Planner<'_> {
    /// Lowers `Op::Softmax { axis }`.
    pub(in crate::plan) fn lower_softmax(&mut self, c: &NodeCtx, axis: &i64) -> Result<Lowered> {
        let p = self;
        let (name, in_shapes, outs, x0) = (c.name, &c.in_shapes, &c.outs, c.x0);
        let x = &in_shapes[0];
        let a = norm_axis(*axis, x.len()).ok_or_else(|| unsupported(name, "bad axis"))?;
        let xl = p.plain(x0, name)?;
        let y = p.output(outs[0], false);
        p.push(
            name,
            StepKind::Softmax(SoftmaxStep {
                x: xl,
                y,
                outer: x[..a].iter().product(),
                len: x[a],
                inner: x[a + 1..].iter().product(),
            }),
        );
        Ok(Lowered::Steps)
    }

    /// Lowers `Op::Reduce { kind, axes, .. }` (ReduceL1/L2/SumSquare arrive from the
    /// importer as elementwise steps around a Sum).
    pub(in crate::plan) fn lower_reduce(
        &mut self,
        c: &NodeCtx,
        kind: ReduceKind,
        axes: &[i64],
    ) -> Result<Lowered> {
        let p = self;
        let (name, in_shapes, outs) = (c.name, &c.in_shapes, &c.outs);
        let x = &in_shapes[0];
        let mut ax: Vec<usize> = axes
            .iter()
            .map(|&a| norm_axis(a, x.len()).ok_or_else(|| unsupported(name, "bad axis")))
            .collect::<Result<_>>()?;
        ax.sort_unstable();
        ax.dedup();
        let hw: usize = ax.iter().map(|&a| x[a]).product();
        let xl = p.reduced_last(c, &ax)?;
        let y = p.output(outs[0], false);
        p.push(
            name,
            StepKind::RowReduce {
                x: xl,
                y,
                rows: x.iter().product::<usize>() / hw.max(1),
                hw,
                kind,
            },
        );
        Ok(Lowered::Steps)
    }

    /// The reduce input with the (sorted) reduced axes `ax` last and contiguous, so each
    /// output element is one contiguous row. Trailing axes need no copy; otherwise the kept
    /// axes (in order, which is also the output's order with or without keepdims) go first
    /// through one strided copy into a temporary.
    pub(in crate::plan) fn reduced_last(&mut self, c: &NodeCtx, ax: &[usize]) -> Result<Loc> {
        let (name, x0) = (c.name, c.x0);
        let rank = c.in_shapes[0].len();
        let trailing = ax.iter().rev().enumerate().all(|(i, &a)| a == rank - 1 - i);
        if trailing {
            return self.plain(x0, name);
        }
        let x = self.raw(x0, name)?;
        let xs = self.strides(x0);
        let perm: Vec<usize> = (0..rank)
            .filter(|a| !ax.contains(a))
            .chain(ax.iter().copied())
            .collect();
        let shape: Vec<usize> = perm.iter().map(|&a| c.in_shapes[0][a]).collect();
        let src: Vec<usize> = perm.iter().map(|&a| xs[a]).collect();
        let s = self.new_storage(self.numel(x0) * self.es);
        let y = Loc::Storage { id: s, offset: 0 };
        let step = format!("{name} (reduced axes last)");
        self.push_copy(&step, [x, y], &shape, [contiguous_strides(&shape), src])?;
        Ok(y)
    }
}
