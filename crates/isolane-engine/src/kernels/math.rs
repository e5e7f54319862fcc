//! Scalar math and index helpers that every layer of the kernels shares: the activations
//! (`unary`, `apply_act` for fused epilogues), f32 `erf`/`exp` without libm calls, and the
//! valid-tap ranges of convolution and pooling windows, and the raw pointer that parallel
//! tasks share. Below both the op kernels and the GEMM
//! layer, so that the GEMM epilogues do not reach up into the op layer.

use crate::ir::Unary;

/// erf in f32: the rational approximation used by Eigen/XLA (a few ulp on [-4, 4], where
/// erf reaches ±1 in f32), so that GELU matches PyTorch's erf-based GELU and vectorises.
#[inline]
pub(crate) fn erf(a: f32) -> f32 {
    let x = a.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = x2 * -2.726_142_3e-10 + 2.770_681_4e-8;
    p = x2 * p + -2.101_024e-6;
    p = x2 * p + -5.692_506_4e-5;
    p = x2 * p + -7.349_906_3e-4;
    p = x2 * p + -2.954_6e-3;
    p = x2 * p + -1.609_603_3e-2;
    p *= x;
    let mut q = x2 * -1.456_607_2e-5 + -2.133_740_6e-4;
    q = x2 * q + -1.682_827e-3;
    q = x2 * q + -7.373_329e-3;
    q = x2 * q + -1.426_473_9e-2;
    p / q
}

/// Applies a pointwise function.
#[inline]
pub(crate) fn unary(op: Unary, x: f32) -> f32 {
    match op {
        Unary::Identity => x,
        Unary::Relu => x.max(0.0),
        Unary::Relu6 => x.clamp(0.0, 6.0),
        Unary::Clip { min, max } => x.max(min).min(max),
        Unary::LeakyRelu { alpha } => {
            if x >= 0.0 {
                x
            } else {
                alpha * x
            }
        }
        Unary::Sigmoid => sigmoid(x),
        Unary::HardSigmoid { alpha, beta } => (alpha * x + beta).clamp(0.0, 1.0),
        Unary::HardSwish => x * (x + 3.0).clamp(0.0, 6.0) / 6.0,
        Unary::Silu => x * sigmoid(x),
        Unary::Gelu => 0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2)),
        Unary::GeluTanh => {
            let c = (2.0f32 / std::f32::consts::PI).sqrt();
            0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
        }
        Unary::Tanh => x.tanh(),
        Unary::Exp => exp(x),
        Unary::Log => x.ln(),
        Unary::Sqrt => x.sqrt(),
        Unary::Erf => erf(x),
        Unary::Neg => -x,
        Unary::Abs => x.abs(),
        Unary::Reciprocal => 1.0 / x,
    }
}

#[inline]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// e^x in f32 without a libm call, so loops over it vectorise: Cephes' `expf` (range
/// reduction by ln 2, degree-6 polynomial, ~1 ulp), with round-to-nearest and the 2^n scale
/// done by bit tricks. Inputs are clamped to [-87, 88] (results stay normal); NaN propagates.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 · 2^23: adding it rounds to an integer.
    let x = x.clamp(-87.0, 88.0);
    let t = x * std::f32::consts::LOG2_E + MAGIC;
    let n = t - MAGIC;
    let r = x - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let r2 = r * r;
    let p = (((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2)
        * r
        + 1.666_666_5e-1)
        * r
        + 0.5)
        * r2
        + r
        + 1.0;
    let ni = (t.to_bits() as i32).wrapping_sub(0x4B40_0000);
    p * f32::from_bits((ni.wrapping_add(127) as u32) << 23)
}

#[inline]
pub(crate) fn apply_act(act: Option<Unary>, v: &mut [f32]) {
    match act {
        None | Some(Unary::Identity) => {}
        Some(Unary::Relu) => v.iter_mut().for_each(|x| *x = x.max(0.0)),
        Some(Unary::Relu6) => v.iter_mut().for_each(|x| *x = x.clamp(0.0, 6.0)),
        // Hot activations get their own loops so that each one vectorises.
        Some(Unary::Silu) => v.iter_mut().for_each(|x| *x *= sigmoid(*x)),
        Some(Unary::Sigmoid) => v.iter_mut().for_each(|x| *x = sigmoid(*x)),
        Some(Unary::Gelu) => v
            .iter_mut()
            .for_each(|x| *x = 0.5 * *x * (1.0 + erf(*x * std::f32::consts::FRAC_1_SQRT_2))),
        Some(Unary::HardSwish) => v
            .iter_mut()
            .for_each(|x| *x = *x * (*x + 3.0).clamp(0.0, 6.0) / 6.0),
        Some(op) => v.iter_mut().for_each(|x| *x = unary(op, *x)),
    }
}

/// Valid output range `[lo, hi)` for a tap at offset `off` so that `o*stride + off ∈ [0, len)`.
#[inline]
pub(crate) fn valid_range(off: isize, stride: usize, len: usize, out: usize) -> (usize, usize) {
    let s = stride as isize;
    let lo = if off < 0 { ((-off) + s - 1) / s } else { 0 };
    let hi = if (len as isize) - off <= 0 {
        0
    } else {
        (((len as isize) - off + s - 1) / s).min(out as isize)
    };
    let lo = lo.max(0) as usize;
    let hi = hi.max(0) as usize;
    (lo.min(hi), hi)
}

/// A raw pointer shared by tasks that touch disjoint parts of what it points to.
#[derive(Clone, Copy)]
pub(crate) struct SharedMut(pub(crate) *mut f32);
// SAFETY: used only by tasks writing disjoint ranges (`conv_tiled` and the op kernels,
// `gemm` in matmul, the implicit convolution's `run`); each use says which range is whose.
unsafe impl Send for SharedMut {}
// SAFETY: as above.
unsafe impl Sync for SharedMut {}

impl SharedMut {
    // A method (not field access) so closures capture the Send/Sync wrapper, not the pointer.
    pub(crate) fn get(self) -> *mut f32 {
        self.0
    }
}
