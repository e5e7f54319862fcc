//! Elementwise ops: `Op::Unary` (also the fused epilogues of Conv and Linear), `Op::Binary`
//! (numpy broadcasting) and `Op::Identity`.

use crate::error::Result;
use crate::ir::{broadcast_shapes, shape_err, Binary, Node};
use crate::kernels::{bcast_strides, BinaryK, Kernel};

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
