//! The CUDA lowering of the `pool` family (its engine home: isolane-engine's `ops/pool.rs`).
//! MaxPool, AveragePool, GlobalAveragePool and AdaptiveAvgPool.

use crate::plan::*;

impl Planner<'_> {
    /// Lowers `Op::MaxPool(pa) | Op::AveragePool(pa)`.
    /// The pool writes bytes only where quantized GEMMs alone read its output
    /// ([`Planner::pooled_bytes`]).
    pub(in crate::plan) fn lower_pool(
        &mut self,
        c: &NodeCtx,
        pa: &PoolAttrs,
        pat: &Patterns,
    ) -> Result<Lowered> {
        let p = self;
        let (n, name, in_shapes, outs, out_shape, x0) =
            (c.n, c.name, &c.in_shapes, &c.outs, &c.out_shape, c.x0);
        // pool2d clips an average's window to the padded input with the top and left pads
        // standing for the bottom and right ones: with the padding counted and other bottom or
        // right pads, its divisor at those edges would be wrong, silently (an even-sized LRN
        // imports as such a pool).
        if matches!(n.op, Op::AveragePool(_))
            && pa.count_include_pad
            && (pa.pads[2] != pa.pads[0] || pa.pads[3] != pa.pads[1])
        {
            return Err(unsupported(
                name,
                format!(
                    "AveragePool with count_include_pad = 1 and asymmetric pads {:?} (top, left, \
                     bottom, right): the cuda pool takes the bottom and right pads as the top \
                     and left ones; run this model on the cpu backend",
                    pa.pads
                ),
            ));
        }
        let xl = p.raw(x0, name)?;
        let keep = p.nhwc[x0];
        let y_quant = p.pooled_bytes(outs[0], keep, pat);
        let y = match y_quant {
            Some((s, t)) => p.bytes_output(outs[0], s, t, keep),
            None => p.output(outs[0], keep),
        };
        p.push(
            name,
            StepKind::Pool(PoolStep {
                x: xl,
                y,
                max: matches!(n.op, Op::MaxPool(_)),
                x_shape: four(&in_shapes[0], name)?,
                out_hw: [out_shape[2], out_shape[3]],
                kernel: pa.kernel,
                strides: pa.strides,
                pads: [pa.pads[0], pa.pads[1]],
                dilations: pa.dilations,
                count_include_pad: pa.count_include_pad,
                nhwc: keep,
                y_quant,
            }),
        );
        Ok(Lowered::Steps)
    }

    /// Lowers `Op::GlobalAveragePool`.
    pub(in crate::plan) fn lower_global_average_pool(&mut self, c: &NodeCtx) -> Result<Lowered> {
        let p = self;
        let (name, in_shapes, outs, x0) = (c.name, &c.in_shapes, &c.outs, c.x0);
        let x = &in_shapes[0];
        let xl = p.raw(x0, name)?;
        let nhwc = p.nhwc[x0];
        let y = p.output(outs[0], false);
        let hw = x[2..].iter().product();
        if nhwc {
            p.push(
                name,
                StepKind::ChanMean {
                    x: xl,
                    y,
                    n: x[0],
                    c: x[1],
                    hw,
                },
            );
        } else {
            p.push(
                name,
                StepKind::RowReduce {
                    x: xl,
                    y,
                    rows: x[0] * x[1],
                    hw,
                    kind: ReduceKind::Mean,
                },
            );
        }
        Ok(Lowered::Steps)
    }

    /// Lowers `Op::AdaptiveAvgPool { output }`.
    pub(in crate::plan) fn lower_adaptive_average_pool(
        &mut self,
        c: &NodeCtx,
        output: &[usize; 2],
    ) -> Result<Lowered> {
        let p = self;
        let (name, in_shapes, outs, x0) = (c.name, &c.in_shapes, &c.outs, c.x0);
        let xl = p.plain(x0, name)?;
        let y = p.output(outs[0], false);
        p.push(
            name,
            StepKind::AdaptivePool {
                x: xl,
                y,
                x_shape: four(&in_shapes[0], name)?,
                out_hw: *output,
            },
        );
        Ok(Lowered::Steps)
    }
}
