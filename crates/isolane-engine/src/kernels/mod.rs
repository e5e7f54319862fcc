//! The op kernels (f32, on the CPU). Each [`Kernel`] is prepared once from a node and its
//! concrete shapes (all index arithmetic that depends only on shapes is done here), then
//! executed many times on raw buffers handed over through [`Io`].
//!
//! Layers, each using only the ones below it:
//! - `mod.rs`: one kernel per op (the op layer); which kernel a node gets, and its set-up from
//!   the shapes, is the op family's (`crate::ops`);
//! - `implicit`, `matmul`, `packed`: isolane's GEMM (implicit-GEMM convolutions, matrix
//!   products, packed micro-kernels);
//! - `math`: scalar activations, index helpers and the task-shared pointer used by both.
//!
//! The reference evaluator (`crate::reference`) runs these kernels one node at a time; the CPU
//! backend (`crate::cpu`) runs them prepared, on buffers in one arena.

pub(crate) mod implicit;
pub(crate) mod math;
mod matmul;
mod packed;

use std::sync::Arc;

use gemm::Parallelism;
use rayon::prelude::*;

use implicit::Implicit;
use math::{apply_act, exp, valid_range, SharedMut};
use matmul::{BSrc, Mat, Out, PackedB};
use packed::{epilogue, Epi, Isa, PackedA};

use crate::error::{EngineError, Result};
use crate::ir::{Binary, Node, PoolAttrs, ReduceKind, Unary};

/// A buffer a kernel reads or writes: a pointer into memory owned by the compiled model.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawBuf {
    pub ptr: *mut f32,
    pub len: usize,
}

// SAFETY: a RawBuf is a plain (pointer, length) pair into memory owned by a compiled model or
// by the caller of `eval_node`; the CPU backend's compile guarantees that concurrently running code never
// writes a buffer another thread reads (kernels hand out disjoint chunks through rayon).
unsafe impl Send for RawBuf {}
// SAFETY: as above; sharing the descriptor does not itself access the memory.
unsafe impl Sync for RawBuf {}

impl RawBuf {
    pub fn from_slice(s: &mut [f32]) -> Self {
        RawBuf {
            ptr: s.as_mut_ptr(),
            len: s.len(),
        }
    }
    pub fn from_const(s: &[f32]) -> Self {
        // Constants are only ever read; the pointer is mut only to share the type.
        RawBuf {
            ptr: s.as_ptr() as *mut f32,
            len: s.len(),
        }
    }
}

/// The buffers of one kernel invocation.
pub(crate) struct Io<'a> {
    pub ins: &'a [RawBuf],
    pub outs: &'a [RawBuf],
    pub scratch: RawBuf,
}

impl Io<'_> {
    fn inp(&self, i: usize) -> &[f32] {
        let b = self.ins[i];
        // SAFETY: compiling gives every input a buffer that lives (and is not written) while
        // this kernel runs; `len` is the exact element count of that value.
        unsafe { std::slice::from_raw_parts(b.ptr, b.len) }
    }
    /// # Safety
    /// Each output must be taken at most once per kernel invocation; outputs never overlap
    /// inputs or each other (the memory planner, `crate::arena`, assigns disjoint arena ranges to values alive at the
    /// same time, and a node's inputs and outputs are all alive while it runs).
    #[allow(clippy::mut_from_ref)]
    unsafe fn out(&self, i: usize) -> &mut [f32] {
        let b = self.outs[i];
        // SAFETY: see the function's contract.
        unsafe { std::slice::from_raw_parts_mut(b.ptr, b.len) }
    }
    /// # Safety
    /// Taken at most once per invocation; the scratch buffer is private to the running kernel.
    #[allow(clippy::mut_from_ref)]
    unsafe fn scratch(&self) -> &mut [f32] {
        // SAFETY: see the function's contract.
        unsafe { std::slice::from_raw_parts_mut(self.scratch.ptr, self.scratch.len) }
    }
}

/// Elements per parallel task for memory-bound kernels: big enough to amortise scheduling.
const CHUNK: usize = 1 << 14;

#[inline]
fn binary(op: Binary, a: f32, b: f32) -> f32 {
    match op {
        Binary::Add => a + b,
        Binary::Sub => a - b,
        Binary::Mul => a * b,
        Binary::Div => a / b,
        Binary::Pow => {
            if b == 2.0 {
                a * a
            } else if b == 0.5 {
                a.sqrt()
            } else {
                a.powf(b)
            }
        }
        Binary::Max => a.max(b),
        Binary::Min => a.min(b),
    }
}

/// Row-major strides.
pub(crate) fn strides_of(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Broadcast strides of `shape` against an output of rank `rank` (0 where broadcast).
pub(crate) fn bcast_strides(shape: &[usize], out: &[usize]) -> Vec<usize> {
    let st = strides_of(shape);
    let off = out.len() - shape.len();
    (0..out.len())
        .map(|i| {
            if i < off || shape[i - off] == 1 {
                0
            } else {
                st[i - off]
            }
        })
        .collect()
}

/// `C = A·B (+C)` on raw strided matrices through the `gemm` crate.
///
/// # Safety
/// The pointers must cover the m×k, k×n and m×n matrices described by the strides, and `dst`
/// must not overlap `a` or `b`.
#[allow(clippy::too_many_arguments)]
unsafe fn sgemm(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut f32,
    dst_rs: usize,
    a: *const f32,
    a_rs: usize,
    a_cs: usize,
    b: *const f32,
    b_rs: usize,
    b_cs: usize,
    accumulate: bool,
    alpha: f32,
    par: Parallelism,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                // SAFETY: row i of dst is within the m×n destination.
                unsafe { std::slice::from_raw_parts_mut(dst.add(i * dst_rs), n).fill(0.0) };
            }
        }
        return;
    }
    // SAFETY: forwarded from the caller's contract.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            dst_rs as isize,
            accumulate,
            a,
            a_cs as isize,
            a_rs as isize,
            b,
            b_cs as isize,
            b_rs as isize,
            1.0,
            alpha,
            false,
            false,
            false,
            par,
        )
    }
}

/// How a convolution is computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ConvMethod {
    /// 1×1, stride 1, no padding: the input is already the GEMM's right-hand matrix.
    Pointwise,
    /// Lower the input window by window into a column matrix, then one GEMM per group.
    Im2col,
    /// One input channel per group: a direct loop per plane.
    Depthwise,
}

#[derive(Clone, Debug)]
pub(crate) struct ConvK {
    pub(crate) n: usize,
    pub(crate) c: usize,
    pub(crate) h: usize,
    pub(crate) w: usize,
    pub(crate) m: usize,
    pub(crate) oh: usize,
    pub(crate) ow: usize,
    pub(crate) kh: usize,
    pub(crate) kw: usize,
    pub(crate) sh: usize,
    pub(crate) sw: usize,
    pub(crate) pt: usize,
    pub(crate) pl: usize,
    pub(crate) dh: usize,
    pub(crate) dw: usize,
    pub(crate) groups: usize,
    pub(crate) act: Option<Unary>,
    pub(crate) has_bias: bool,
    pub(crate) residual: bool,
    pub(crate) method: ConvMethod,
    /// Output columns per task in the tiled path (im2col block sized to stay in L2).
    pub(crate) tile: usize,
    /// The weights packed for [`PackedA::gemm`] when they are a constant (done at
    /// compile time); otherwise the `gemm` crate multiplies them as they are.
    pub(crate) packed: Option<Arc<PackedA>>,
    /// An implicit-GEMM layout (no im2col matrix), used with `packed` where it pays.
    pub(crate) implicit: Option<Arc<Implicit>>,
}

#[derive(Clone, Debug)]
pub(crate) struct MatMulK {
    pub(crate) m: usize,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) a_rs: usize,
    pub(crate) a_cs: usize,
    pub(crate) b_rs: usize,
    pub(crate) b_cs: usize,
    /// Per output matrix: offsets of its A and B matrices.
    pub(crate) offsets: Vec<(usize, usize)>,
    /// ONNX Gemm: alpha scale; C prefilled.
    pub(crate) alpha: f32,
    /// Gemm's C: (beta, row stride, col stride) into input 2.
    pub(crate) c: Option<(f32, usize, usize)>,
}

#[derive(Clone, Debug)]
pub(crate) struct BinaryK {
    pub(crate) op: Binary,
    pub(crate) out_shape: Vec<usize>,
    pub(crate) a_st: Vec<usize>,
    pub(crate) b_st: Vec<usize>,
    pub(crate) same: bool,
}

/// Copies `out[i] = in[base + Σ idx_j·strides_j]` over the output's multi-index: transpose,
/// slice and expand are all this.
#[derive(Clone, Debug)]
pub(crate) struct StridedK {
    pub(crate) out_shape: Vec<usize>,
    pub(crate) strides: Vec<isize>,
    pub(crate) base: isize,
}

#[derive(Clone, Debug)]
pub(crate) struct PoolK {
    pub(crate) nc: usize,
    pub(crate) h: usize,
    pub(crate) w: usize,
    pub(crate) oh: usize,
    pub(crate) ow: usize,
    pub(crate) p: PoolAttrs,
    /// Valid input rows / columns of each output row / column's window (dilation 1).
    pub(crate) ys: Vec<(usize, usize)>,
    pub(crate) xs: Vec<(usize, usize)>,
}

#[derive(Clone, Debug)]
pub(crate) struct ResizeK {
    pub(crate) nc: usize,
    pub(crate) h: usize,
    pub(crate) w: usize,
    pub(crate) oh: usize,
    pub(crate) ow: usize,
    pub(crate) linear: bool,
    /// Per output row/column: (i0, i1, weight of i1). Nearest: i0 only.
    pub(crate) ys: Vec<(usize, usize, f32)>,
    pub(crate) xs: Vec<(usize, usize, f32)>,
}

/// A kernel prepared for one node's concrete shapes.
#[derive(Clone, Debug)]
pub(crate) enum Kernel {
    Conv(ConvK),
    Linear {
        rows: usize,
        k: usize,
        n: usize,
        act: Option<Unary>,
        has_bias: bool,
        /// The constant weight, transposed and padded for the GEMM (done at compile time).
        wt: Option<Arc<PackedB>>,
    },
    MatMul(MatMulK),
    Unary(Unary),
    Binary(BinaryK),
    BatchNorm {
        n: usize,
        c: usize,
        hw: usize,
        eps: f32,
    },
    MaxPool(PoolK),
    AvgPool(PoolK),
    AdaptiveAvg {
        nc: usize,
        h: usize,
        w: usize,
        oh: usize,
        ow: usize,
    },
    Strided(StridedK),
    Concat {
        outer: usize,
        /// Per input: contiguous chunk per outer index.
        chunks: Vec<usize>,
    },
    Split {
        outer: usize,
        chunks: Vec<usize>,
    },
    Gather {
        outer: usize,
        dim: usize,
        inner: usize,
        indices: Vec<usize>,
    },
    Softmax {
        outer: usize,
        dim: usize,
        inner: usize,
    },
    LayerNorm {
        rows: usize,
        d: usize,
        eps: f32,
        has_bias: bool,
    },
    Reduce {
        kind: ReduceKind,
        /// Per output element: its base offset into the input.
        bases: Vec<usize>,
        /// Offsets of the reduced elements relative to a base.
        offsets: Vec<usize>,
    },
    Resize(ResizeK),
    /// `DequantizeLinear(QuantizeLinear(x))`; the scales are indexed by element (`shape`).
    FakeQuant {
        attrs: Arc<crate::quant::FakeQuantAttrs>,
        shape: Vec<usize>,
    },
    Copy,
}

pub(crate) fn unsupported(n: &Node, msg: impl Into<String>) -> EngineError {
    EngineError::Shape {
        node: n.name.clone(),
        op: n.op.name().to_string(),
        msg: msg.into(),
    }
}

impl Kernel {
    /// Plans a kernel for `node` given concrete input and output shapes: the op's family
    /// (`crate::ops`) chooses and sets it up.
    pub fn prepare(node: &Node, ins: &[&[usize]], outs: &[&[usize]]) -> Result<Kernel> {
        crate::ops::prepare(node, ins, outs)
    }

    /// Packs a convolution's or a Linear layer's constant weights `w` for the
    /// allocation-free GEMM (compile time).
    pub fn prepack(&mut self, w: &[f32]) {
        match self {
            Kernel::Conv(c) if c.method != ConvMethod::Depthwise => {
                let mg = c.m / c.groups;
                let kk = (c.c / c.groups) * c.kh * c.kw;
                if w.len() == c.groups * mg * kk {
                    c.packed = Some(Arc::new(PackedA::new(w, c.groups, mg, kk)));
                }
            }
            Kernel::Linear { k, n, wt, .. } if w.len() == *k * *n => {
                *wt = Some(Arc::new(PackedB::from_linear_weight(w, *n, *k)));
            }
            _ => {}
        }
    }

    /// Fixes the work split for a pool of `threads` threads (compile time, after `prepack`):
    /// an implicit-GEMM convolution lays out its scratch per thread.
    pub fn configure(&mut self, threads: usize) {
        if let Kernel::Conv(ConvK {
            implicit: Some(imp),
            packed: Some(pa),
            ..
        }) = self
        {
            *imp = Arc::new(imp.configure(threads, pa.isa.mr()));
        }
    }

    /// Elements of scratch memory this kernel needs.
    pub fn scratch_len(&self, threads: usize) -> usize {
        match self {
            Kernel::Conv(ConvK {
                implicit: Some(imp),
                packed: Some(_),
                ..
            }) if imp.is_configured() => imp.scratch_len(),
            Kernel::Linear { rows, k, n, wt, .. } => {
                matmul::scratch_len(Isa::detect(), *rows, *n, *k, wt.is_some())
            }
            Kernel::MatMul(mk) => {
                let one = matmul::scratch_len(Isa::detect(), mk.m, mk.n, mk.k, mk.b_cs == 1);
                if mk.per_matrix(threads) {
                    one * threads
                } else {
                    one
                }
            }
            Kernel::Conv(c) if c.method == ConvMethod::Im2col => {
                let kk = (c.c / c.groups) * c.kh * c.kw;
                // Row strides rounded up to 16 (see `ConvK::col_stride`).
                let whole = kk * (c.oh * c.ow).next_multiple_of(16);
                if c.tiled(threads) {
                    // Thread `t` uses [t·kk·tile16, (t + 1)·kk·tile16).
                    kk * c.tile.next_multiple_of(16) * threads.max(1)
                } else {
                    whole
                }
            }
            _ => 0,
        }
    }

    /// Executes the kernel. `threads` is the size of the pool it runs in.
    pub fn run(&self, io: &Io, threads: usize) {
        let par = if threads > 1 {
            Parallelism::Rayon(0)
        } else {
            Parallelism::None
        };
        match self {
            Kernel::Conv(c) => conv(c, io, par, threads),
            Kernel::Linear {
                rows,
                k,
                n,
                act,
                has_bias,
                wt,
            } => {
                let x = io.inp(0);
                let w = io.inp(1);
                // SAFETY: single output taken once.
                let out = unsafe { io.out(0) };
                // SAFETY: scratch taken once.
                let scratch = unsafe { io.scratch() };
                let b = match wt {
                    Some(pb) => BSrc::Packed(pb),
                    // Wᵀ read through its strides: element (kk, j) is w[j·k + kk].
                    None => BSrc::Mat(Mat {
                        ptr: w.as_ptr(),
                        rs: 1,
                        cs: *k,
                    }),
                };
                let a = Mat {
                    ptr: x.as_ptr(),
                    rs: *k,
                    cs: 1,
                };
                let o = Out {
                    c: out.as_mut_ptr(),
                    ldc: *n,
                    acc_c: false,
                    col_bias: if *has_bias { Some(io.inp(2)) } else { None },
                    act: *act,
                };
                // SAFETY: x is rows×k, w is n×k, out is rows×n and overlaps neither; the
                // scratch was sized by scratch_len for these shapes.
                unsafe {
                    matmul::gemm(
                        Isa::detect(),
                        *rows,
                        *n,
                        *k,
                        a,
                        b,
                        1.0,
                        o,
                        scratch.as_mut_ptr(),
                        threads > 1,
                        threads,
                    )
                };
            }
            Kernel::MatMul(mk) => matmul_kernel(mk, io, threads),
            Kernel::Unary(u) => {
                let x = io.inp(0);
                // SAFETY: single output taken once.
                let out = unsafe { io.out(0) };
                let u = *u;
                out.par_chunks_mut(CHUNK)
                    .zip(x.par_chunks(CHUNK))
                    .for_each(|(o, i)| {
                        o.copy_from_slice(i);
                        apply_act(Some(u), o);
                    });
            }
            Kernel::FakeQuant { attrs, shape } => {
                let x = io.inp(0);
                // SAFETY: single output taken once.
                let out = unsafe { io.out(0) };
                out.par_chunks_mut(CHUNK)
                    .zip(x.par_chunks(CHUNK))
                    .enumerate()
                    .for_each(|(k, (o, i))| attrs.apply_into(shape, i, o, k * CHUNK));
            }
            Kernel::Copy => {
                let x = io.inp(0);
                // SAFETY: single output taken once.
                let out = unsafe { io.out(0) };
                out.copy_from_slice(x);
            }
            Kernel::Binary(b) => binary_kernel(b, io),
            Kernel::BatchNorm { n, c, hw, eps } => {
                let x = io.inp(0);
                let (g, bt, mean, var) = (io.inp(1), io.inp(2), io.inp(3), io.inp(4));
                // SAFETY: single output taken once.
                let out = unsafe { io.out(0) };
                let _ = n;
                out.par_chunks_mut(hw.max(&1).to_owned())
                    .zip(x.par_chunks(*hw.max(&1)))
                    .enumerate()
                    .for_each(|(p, (o, i))| {
                        let ch = p % c;
                        let s = g[ch] / (var[ch] + eps).sqrt();
                        let t = bt[ch] - mean[ch] * s;
                        o.iter_mut().zip(i).for_each(|(o, &i)| *o = i * s + t);
                    });
            }
            Kernel::MaxPool(p) => pool(p, io, true),
            Kernel::AvgPool(p) => pool(p, io, false),
            Kernel::AdaptiveAvg { nc, h, w, oh, ow } => {
                let x = io.inp(0);
                // SAFETY: single output taken once.
                let out = unsafe { io.out(0) };
                let (h, w, oh, ow) = (*h, *w, *oh, *ow);
                let _ = nc;
                out.par_chunks_mut(oh * ow)
                    .zip(x.par_chunks(h * w))
                    .for_each(|(o, i)| {
                        for y in 0..oh {
                            let (y0, y1) = (y * h / oh, ((y + 1) * h).div_ceil(oh));
                            for xx in 0..ow {
                                let (x0, x1) = (xx * w / ow, ((xx + 1) * w).div_ceil(ow));
                                let mut s = 0.0f32;
                                for r in y0..y1 {
                                    s += i[r * w + x0..r * w + x1].iter().sum::<f32>();
                                }
                                o[y * ow + xx] = s / ((y1 - y0) * (x1 - x0)) as f32;
                            }
                        }
                    });
            }
            Kernel::Strided(s) => strided(s, io),
            Kernel::Concat { outer, chunks } => {
                // SAFETY: single output taken once.
                let out = unsafe { io.out(0) };
                let total: usize = chunks.iter().sum();
                for o in 0..*outer {
                    let mut pos = o * total;
                    for (i, &ch) in chunks.iter().enumerate() {
                        out[pos..pos + ch].copy_from_slice(&io.inp(i)[o * ch..(o + 1) * ch]);
                        pos += ch;
                    }
                }
            }
            Kernel::Split { outer, chunks } => {
                let x = io.inp(0);
                let total: usize = chunks.iter().sum();
                let mut pos = 0;
                for (i, &ch) in chunks.iter().enumerate() {
                    // SAFETY: each output taken once.
                    let out = unsafe { io.out(i) };
                    for o in 0..*outer {
                        out[o * ch..(o + 1) * ch]
                            .copy_from_slice(&x[o * total + pos..o * total + pos + ch]);
                    }
                    pos += ch;
                }
            }
            Kernel::Gather {
                outer,
                dim,
                inner,
                indices,
            } => {
                let x = io.inp(0);
                // SAFETY: single output taken once.
                let out = unsafe { io.out(0) };
                let mut pos = 0;
                for o in 0..*outer {
                    for &ix in indices {
                        let src = (o * dim + ix) * inner;
                        out[pos..pos + inner].copy_from_slice(&x[src..src + inner]);
                        pos += inner;
                    }
                }
            }
            Kernel::Softmax { outer, dim, inner } => softmax(io, *outer, *dim, *inner),
            Kernel::LayerNorm {
                rows,
                d,
                eps,
                has_bias,
            } => {
                let x = io.inp(0);
                let g = io.inp(1);
                let b = if *has_bias { Some(io.inp(2)) } else { None };
                // SAFETY: single output taken once.
                let out = unsafe { io.out(0) };
                let (d, eps) = (*d, *eps);
                let _ = rows;
                par_row_pairs(x, out, d, |xr, o| layer_norm_row(xr, o, g, b, eps));
            }
            Kernel::Reduce {
                kind,
                bases,
                offsets,
            } => {
                let x = io.inp(0);
                // SAFETY: single output taken once.
                let out = unsafe { io.out(0) };
                let n = offsets.len();
                out.par_iter_mut()
                    .zip(bases.par_iter())
                    .for_each(|(o, &b)| {
                        *o = kind.apply(offsets.iter().map(|&off| x[b + off]), n);
                    });
            }
            Kernel::Resize(r) => resize(r, io),
        }
    }
}

fn layer_norm_row(x: &[f32], o: &mut [f32], g: &[f32], b: Option<&[f32]>, eps: f32) {
    let d = x.len() as f32;
    let mean = x.iter().sum::<f32>() / d;
    let var = x.iter().map(|&v| (v - mean) * (v - mean)).sum::<f32>() / d;
    let inv = 1.0 / (var + eps).sqrt();
    match b {
        Some(b) => {
            for i in 0..x.len() {
                o[i] = (x[i] - mean) * inv * g[i] + b[i];
            }
        }
        None => {
            for i in 0..x.len() {
                o[i] = (x[i] - mean) * inv * g[i];
            }
        }
    }
}

impl ConvK {
    /// How this convolution runs, for profiles.
    pub fn describe(&self) -> String {
        match (&self.implicit, &self.packed) {
            (Some(imp), Some(_)) if imp.is_configured() => "ImplicitGemm".into(),
            _ => format!("{:?}", self.method),
        }
    }

    /// Row stride of an im2col block of `nn` columns: a multiple of 16 for the packed GEMM,
    /// so that every row starts on a cache line and is read in place.
    fn col_stride(&self, nn: usize) -> usize {
        if self.packed.is_some() {
            nn.next_multiple_of(16)
        } else {
            nn
        }
    }

    /// Tile-parallel (each task lowers and multiplies its own block of output columns, then
    /// applies the epilogue while the block is in cache) when there are enough tiles to keep
    /// every thread busy; otherwise whole-matrix GEMMs parallelised inside `gemm`.
    fn tiled(&self, threads: usize) -> bool {
        let tiles = (self.oh * self.ow).div_ceil(self.tile) * self.n * self.groups;
        self.method != ConvMethod::Depthwise && (threads <= 1 || tiles >= 2 * threads)
    }

    /// Row `row` of the lowered (im2col) matrix: its input channel's plane in `x`, its
    /// kernel row, and the input column offset of its kernel column at output column 0.
    fn lowered_row<'x>(&self, x: &'x [f32], row: usize) -> (&'x [f32], usize, isize) {
        let kj = row % self.kw;
        let ki = (row / self.kw) % self.kh;
        let ci = row / (self.kw * self.kh);
        let hw = self.h * self.w;
        let xoff = (kj * self.dw) as isize - self.pl as isize;
        (&x[ci * hw..(ci + 1) * hw], ki, xoff)
    }
}

fn conv_tiled(c: &ConvK, io: &Io, threads: usize) {
    let x = io.inp(0);
    let wt = io.inp(1);
    let bias = if c.has_bias { Some(io.inp(2)) } else { None };
    let res = if c.residual { Some(io.inp(3)) } else { None };
    // SAFETY: single output taken once; tasks below write disjoint column blocks of it.
    let out = SharedMut(unsafe { io.out(0) }.as_mut_ptr());
    // SAFETY: scratch taken once; each worker thread uses its own `kk × tile` slice.
    let scratch = SharedMut(unsafe { io.scratch() }.as_mut_ptr());
    let (hw, ohw) = (c.h * c.w, c.oh * c.ow);
    let cg = c.c / c.groups;
    let mg = c.m / c.groups;
    let kk = cg * c.kh * c.kw;
    // Balance: round the tile count up to a multiple of the thread count (per image and
    // group), keeping whole output rows per tile when the planned tile does.
    let threads_ = threads.max(1);
    let base = ohw.div_ceil(c.tile);
    let per = c.n * c.groups;
    let want = (base * per).div_ceil(threads_) * threads_;
    let mut tile = ohw.div_ceil(want.div_ceil(per).max(1));
    if c.tile.is_multiple_of(c.ow) {
        tile = tile.div_ceil(c.ow) * c.ow;
    }
    let tile = if tile == 0 || tile > c.tile {
        c.tile
    } else {
        tile
    };
    let tiles = ohw.div_ceil(tile);
    let tasks = c.n * c.groups * tiles;
    let threads = threads.max(1);
    let task = |t: usize| {
        let ti = t % tiles;
        let g = (t / tiles) % c.groups;
        let ni = t / (tiles * c.groups);
        let n0 = ti * tile;
        let nn = tile.min(ohw - n0);
        let xin = &x[(ni * c.c + g * cg) * hw..(ni * c.c + (g + 1) * cg) * hw];
        let (rhs, rhs_rs) = if c.method == ConvMethod::Pointwise {
            (xin[n0..].as_ptr(), hw)
        } else {
            let tid = rayon::current_thread_index().unwrap_or(0) % threads;
            let ld = c.col_stride(nn);
            // SAFETY: thread `tid` owns scratch[tid*kk*tile16 ..][.. kk*tile16] (tile16 = tile
            // rounded up to 16, ≥ the row stride `ld`); a thread runs one
            // task at a time and tasks do not yield to rayon while holding the slice.
            let col = unsafe {
                std::slice::from_raw_parts_mut(
                    scratch.get().add(tid * kk * c.tile.next_multiple_of(16)),
                    kk * ld,
                )
            };
            im2col_cols(c, xin, n0, nn, col, ld);
            (col.as_ptr(), ld)
        };
        let row0 = ni * c.m + g * mg;
        if let Some(pa) = &c.packed {
            let epi = Epi {
                col_bias: None,
                bias: bias.map(|b| &b[g * mg..(g + 1) * mg]),
                res: res.map(|rs| rs[row0 * ohw + n0..].as_ptr()),
                act: c.act,
            };
            // SAFETY: dst is rows row0..row0+mg, columns n0..n0+nn of the output, a block no
            // other task touches; rhs is kk×nn with row stride rhs_rs; the residual block is
            // laid out like dst.
            unsafe {
                let dst = out.get().add(row0 * ohw + n0);
                pa.gemm(g, 0, pa.panels, nn, rhs, rhs_rs, dst, ohw, &epi);
            }
            return;
        }
        // SAFETY: dst is rows row0..row0+mg, columns n0..n0+nn of the output, a block no other
        // task touches; a is mg×kk; rhs is kk×nn with row stride rhs_rs.
        unsafe {
            let dst = out.get().add(row0 * ohw + n0);
            sgemm(
                mg,
                nn,
                kk,
                dst,
                ohw,
                wt[g * mg * kk..].as_ptr(),
                kk,
                1,
                rhs,
                rhs_rs,
                1,
                false,
                1.0,
                Parallelism::None,
            );
            if bias.is_some() || res.is_some() || c.act.is_some() {
                for r in 0..mg {
                    let v = std::slice::from_raw_parts_mut(dst.add(r * ohw), nn);
                    let b = bias.map_or(0.0, |b| b[g * mg + r]);
                    let rr = res.map(|rs| &rs[(row0 + r) * ohw + n0..(row0 + r) * ohw + n0 + nn]);
                    epilogue(v, b, rr, c.act);
                }
            }
        }
    };
    if threads == 1 {
        (0..tasks).for_each(task);
    } else {
        (0..tasks).into_par_iter().for_each(task);
    }
}

/// im2col of output columns `n0..n0+nn` into `col` (`kk × nn`, row-major).
fn im2col_cols(c: &ConvK, x: &[f32], n0: usize, nn: usize, col: &mut [f32], ld: usize) {
    let (h, w) = (c.h, c.w);
    if c.sw == 1 && c.sh == 1 && c.ow == w && n0.is_multiple_of(w) && nn.is_multiple_of(w) {
        return im2col_rows(c, x, n0 / w, nn / w, col, ld);
    }
    for (row, dst) in col.chunks_mut(ld).enumerate() {
        let dst = &mut dst[..nn];
        let (plane, ki, xoff) = c.lowered_row(x, row);
        let (xlo, xhi) = valid_range(xoff, c.sw, w, c.ow);
        let mut col_i = n0;
        let end = n0 + nn;
        while col_i < end {
            let oy = col_i / c.ow;
            let ox0 = col_i % c.ow;
            let ox1 = c.ow.min(ox0 + (end - col_i));
            let d = &mut dst[col_i - n0..col_i - n0 + (ox1 - ox0)];
            col_i += ox1 - ox0;
            let iy = (oy * c.sh + ki * c.dh) as isize - c.pt as isize;
            if iy < 0 || iy >= h as isize {
                d.fill(0.0);
                continue;
            }
            let src = &plane[iy as usize * w..(iy as usize + 1) * w];
            let (a, b) = (xlo.max(ox0).min(ox1), xhi.max(ox0).min(ox1));
            d[..a - ox0].fill(0.0);
            d[b - ox0..].fill(0.0);
            copy_taps(&mut d[a - ox0..b - ox0], src, a, c.sw, xoff);
        }
    }
}

/// `d[j] = src[(lo + j)·sw + xoff]`: the valid taps of one input row for the output columns
/// `lo..lo + d.len()` of an im2col row.
#[inline(always)]
fn copy_taps(d: &mut [f32], src: &[f32], lo: usize, sw: usize, xoff: isize) {
    let n = d.len();
    if n == 0 {
        return;
    }
    let s0 = (lo as isize * sw as isize + xoff) as usize;
    if sw == 1 {
        d.copy_from_slice(&src[s0..s0 + n]);
    } else {
        // Indexed form: the bounds are provable, so the loop compiles to plain strided loads.
        let s = &src[s0..s0 + sw * (n - 1) + 1];
        for j in 0..n {
            d[j] = s[j * sw];
        }
    }
}

/// im2col for stride 1 with output width = input width, over whole output rows
/// `oy0..oy0+rows`: each lowered row is one contiguous run of the input plane shifted by the
/// tap's offset, followed by zeroing the few columns that fall into the padding.
fn im2col_rows(c: &ConvK, x: &[f32], oy0: usize, rows: usize, col: &mut [f32], ld: usize) {
    let (h, w) = (c.h, c.w);
    let nn = rows * w;
    let plane_len = (h * w) as isize;
    for (row, dst) in col.chunks_mut(ld).enumerate() {
        let dst = &mut dst[..nn];
        let (plane, ki, xoff) = c.lowered_row(x, row);
        let (xlo, xhi) = valid_range(xoff, 1, w, w);
        // Output rows whose input row lies inside the plane.
        let yoff = (ki * c.dh) as isize - c.pt as isize;
        let (ylo, yhi) = valid_range(yoff, 1, h, c.oh);
        let (ya, yb) = (ylo.clamp(oy0, oy0 + rows), yhi.clamp(oy0, oy0 + rows));
        dst[..(ya - oy0) * w].fill(0.0);
        dst[(yb.max(ya) - oy0) * w..].fill(0.0);
        if yb <= ya {
            continue;
        }
        // Flat input offset of output element (ya, 0); copy the clipped span.
        let d0 = (ya - oy0) * w;
        let len = (yb - ya) * w;
        let s0 = (ya as isize + yoff) * w as isize + xoff;
        let (a, b) = (s0.max(0), (s0 + len as isize).min(plane_len));
        if b > a {
            let da = d0 + (a - s0) as usize;
            dst[da..da + (b - a) as usize].copy_from_slice(&plane[a as usize..b as usize]);
        }
        // Columns outside [xlo, xhi) read across a row boundary (or past the plane): zero.
        for r in 0..yb - ya {
            let rowd = &mut dst[d0 + r * w..d0 + (r + 1) * w];
            rowd[..xlo].fill(0.0);
            rowd[xhi..].fill(0.0);
        }
    }
}

fn conv(c: &ConvK, io: &Io, par: Parallelism, threads: usize) {
    if let (Some(imp), Some(pa)) = (&c.implicit, &c.packed) {
        if !imp.is_configured() {
            return conv_lowered(c, io, par, threads);
        }
        let bias = if c.has_bias { Some(io.inp(2)) } else { None };
        let res = if c.residual { Some(io.inp(3)) } else { None };
        // SAFETY: output and scratch taken once each; the scratch was sized by `scratch_len`
        // for this kernel and thread count, starts on a cache line and is private to it.
        unsafe {
            let out = io.out(0).as_mut_ptr();
            let scratch = io.scratch().as_mut_ptr();
            imp.run(pa, io.inp(0), bias, res, c.act, out, scratch, threads);
        }
        return;
    }
    conv_lowered(c, io, par, threads)
}

/// Convolution through an explicit im2col (or the input itself, for pointwise ones).
fn conv_lowered(c: &ConvK, io: &Io, par: Parallelism, threads: usize) {
    if c.tiled(threads) {
        return conv_tiled(c, io, threads);
    }
    let x = io.inp(0);
    let wt = io.inp(1);
    let bias = if c.has_bias { Some(io.inp(2)) } else { None };
    let res = if c.residual { Some(io.inp(3)) } else { None };
    // SAFETY: single output taken once.
    let out = unsafe { io.out(0) };
    let (hw, ohw) = (c.h * c.w, c.oh * c.ow);
    let cg = c.c / c.groups;
    let mg = c.m / c.groups;
    let kk = cg * c.kh * c.kw;
    match c.method {
        ConvMethod::Depthwise => {
            out.par_chunks_mut(ohw).enumerate().for_each(|(plane, o)| {
                let (ni, oc) = (plane / c.m, plane % c.m);
                let ic = oc / mg;
                let inp = &x[(ni * c.c + ic) * hw..(ni * c.c + ic + 1) * hw];
                let k = &wt[oc * c.kh * c.kw..(oc + 1) * c.kh * c.kw];
                depthwise_plane(c, inp, k, o);
                let b = bias.map_or(0.0, |b| b[oc]);
                if let Some(r) = res {
                    let r = &r[plane * ohw..(plane + 1) * ohw];
                    o.iter_mut().zip(r).for_each(|(v, r)| *v += b + r);
                } else if b != 0.0 {
                    o.iter_mut().for_each(|v| *v += b);
                }
                apply_act(c.act, o);
            });
        }
        ConvMethod::Pointwise | ConvMethod::Im2col => {
            for ni in 0..c.n {
                for g in 0..c.groups {
                    let xin = &x[(ni * c.c + g * cg) * hw..(ni * c.c + (g + 1) * cg) * hw];
                    let (rhs, ld): (&[f32], usize) = if c.method == ConvMethod::Pointwise {
                        (xin, hw)
                    } else {
                        // SAFETY: scratch taken once per group iteration and not aliased.
                        let col = unsafe { io.scratch() };
                        let ld = c.col_stride(ohw);
                        let col = &mut col[..kk * ld];
                        im2col(c, xin, col, ld);
                        (col, ld)
                    };
                    let dst = &mut out[(ni * c.m + g * mg) * ohw..(ni * c.m + (g + 1) * mg) * ohw];
                    let a = &wt[g * mg * kk..(g + 1) * mg * kk];
                    // Few output columns (deep layers): split the output channels among the
                    // threads, each running a single-threaded GEMM on its rows.
                    let chunks = if threads > 1 {
                        (2 * threads).min(mg.div_ceil(16)).max(1)
                    } else {
                        1
                    };
                    let row0 = ni * c.m + g * mg;
                    if let Some(pa) = &c.packed {
                        // Whole MR-row panels per task.
                        let per = pa.panels.div_ceil(chunks);
                        let mr = pa.isa.mr();
                        let dst = SharedMut(dst.as_mut_ptr());
                        let rhs = SharedMut(rhs.as_ptr() as *mut f32);
                        let run_panels = |ci: usize| {
                            let (p0, p1) = (ci * per, ((ci + 1) * per).min(pa.panels));
                            if p0 >= p1 {
                                return;
                            }
                            let epi = Epi {
                                col_bias: None,
                                bias: bias.map(|b| &b[g * mg..(g + 1) * mg]),
                                res: res.map(|rs| rs[(row0 + p0 * mr) * ohw..].as_ptr()),
                                act: c.act,
                            };
                            // SAFETY: rows p0·MR..min(p1·MR, mg) of this group's output, which
                            // no other task writes; rhs is kk×ohw; residual laid out like dst.
                            unsafe {
                                pa.gemm(
                                    g,
                                    p0,
                                    p1,
                                    ohw,
                                    rhs.get(),
                                    ld,
                                    dst.get().add(p0 * mr * ohw),
                                    ohw,
                                    &epi,
                                )
                            };
                        };
                        if chunks > 1 {
                            (0..chunks).into_par_iter().for_each(run_panels);
                        } else {
                            run_panels(0);
                        }
                        continue;
                    }
                    let rows = mg.div_ceil(chunks);
                    let run_rows = |(ci, d): (usize, &mut [f32])| {
                        let m0 = ci * rows;
                        let mm = d.len() / ohw.max(1);
                        // SAFETY: a's rows m0..m0+mm (kk each), rhs kk×ohw, d mm×ohw: in bounds
                        // and disjoint.
                        unsafe {
                            sgemm(
                                mm,
                                ohw,
                                kk,
                                d.as_mut_ptr(),
                                ohw,
                                a[m0 * kk..].as_ptr(),
                                kk,
                                1,
                                rhs.as_ptr(),
                                ld,
                                1,
                                false,
                                1.0,
                                if chunks > 1 { Parallelism::None } else { par },
                            )
                        };
                        if bias.is_some() || res.is_some() || c.act.is_some() {
                            for (r, v) in d.chunks_mut(ohw).enumerate() {
                                let oc = g * mg + m0 + r;
                                let b = bias.map_or(0.0, |b| b[oc]);
                                let p0 = (row0 + m0 + r) * ohw;
                                epilogue(v, b, res.map(|rs| &rs[p0..p0 + ohw]), c.act);
                            }
                        }
                    };
                    if chunks > 1 {
                        dst.par_chunks_mut(rows * ohw)
                            .enumerate()
                            .for_each(run_rows);
                    } else {
                        dst.chunks_mut(rows * ohw).enumerate().for_each(run_rows);
                    }
                }
            }
        }
    }
}

fn im2col(c: &ConvK, x: &[f32], col: &mut [f32], ld: usize) {
    let ohw = c.oh * c.ow;
    let (h, w) = (c.h, c.w);
    col.par_chunks_mut(ld).enumerate().for_each(|(row, dst)| {
        let dst = &mut dst[..ohw];
        let (plane, ki, xoff) = c.lowered_row(x, row);
        let (xlo, xhi) = valid_range(xoff, c.sw, w, c.ow);
        for oy in 0..c.oh {
            let iy = (oy * c.sh + ki * c.dh) as isize - c.pt as isize;
            let d = &mut dst[oy * c.ow..(oy + 1) * c.ow];
            if iy < 0 || iy >= h as isize {
                d.fill(0.0);
                continue;
            }
            let src = &plane[iy as usize * w..(iy as usize + 1) * w];
            d[..xlo].fill(0.0);
            d[xhi..].fill(0.0);
            copy_taps(&mut d[xlo..xhi], src, xlo, c.sw, xoff);
        }
    });
}

fn depthwise_plane(c: &ConvK, inp: &[f32], k: &[f32], o: &mut [f32]) {
    o.fill(0.0);
    let (h, w) = (c.h, c.w);
    for ki in 0..c.kh {
        for kj in 0..c.kw {
            let wv = k[ki * c.kw + kj];
            let xoff = (kj * c.dw) as isize - c.pl as isize;
            let (xlo, xhi) = valid_range(xoff, c.sw, w, c.ow);
            if xlo >= xhi {
                continue;
            }
            let yoff = (ki * c.dh) as isize - c.pt as isize;
            let (ylo, yhi) = valid_range(yoff, c.sh, h, c.oh);
            for oy in ylo..yhi {
                let iy = (oy as isize * c.sh as isize + yoff) as usize;
                let src = &inp[iy * w..(iy + 1) * w];
                let d = &mut o[oy * c.ow + xlo..oy * c.ow + xhi];
                if c.sw == 1 {
                    let s0 = (xlo as isize + xoff) as usize;
                    let s = &src[s0..s0 + d.len()];
                    d.iter_mut().zip(s).for_each(|(d, &s)| *d += wv * s);
                } else {
                    let sw = c.sw;
                    let s0 = (xlo as isize * sw as isize + xoff) as usize;
                    let n = d.len();
                    // Indexed with provable bounds: compiles to strided loads, no checks.
                    let s = &src[s0..s0 + sw * (n - 1) + 1];
                    for j in 0..n {
                        d[j] += wv * s[j * sw];
                    }
                }
            }
        }
    }
}

impl MatMulK {
    /// Many matrices (attention heads): one task per matrix, each thread with its own scratch;
    /// otherwise one matrix at a time, split among the threads.
    fn per_matrix(&self, threads: usize) -> bool {
        threads > 1 && self.offsets.len() >= threads
    }
}

fn matmul_kernel(mk: &MatMulK, io: &Io, threads: usize) {
    let a = io.inp(0);
    let b = io.inp(1);
    // SAFETY: single output taken once.
    let out = unsafe { io.out(0) };
    // SAFETY: scratch taken once.
    let scratch = SharedMut(unsafe { io.scratch() }.as_mut_ptr());
    let mn = mk.m * mk.n;
    if mn == 0 {
        return;
    }
    let mut acc_c = false;
    if let Some((beta, rs, cs)) = mk.c {
        let c = io.inp(2);
        for i in 0..mk.m {
            for j in 0..mk.n {
                out[i * mk.n + j] = beta * c[i * rs + j * cs];
            }
        }
        acc_c = true;
    }
    let isa = Isa::detect();
    let per = matmul::scratch_len(isa, mk.m, mk.n, mk.k, mk.b_cs == 1);
    let one = |dst: &mut [f32], oa: usize, ob: usize, scratch: *mut f32, par: bool| {
        let o = Out {
            c: dst.as_mut_ptr(),
            ldc: mk.n,
            acc_c,
            col_bias: None,
            act: None,
        };
        let am = Mat {
            ptr: a[oa..].as_ptr(),
            rs: mk.a_rs,
            cs: mk.a_cs,
        };
        let bm = Mat {
            ptr: b[ob..].as_ptr(),
            rs: mk.b_rs,
            cs: mk.b_cs,
        };
        // SAFETY: the offsets were computed from the shapes, so both matrices are inside a and
        // b; dst is one m×n output matrix; `scratch` holds `per` floats used by no one else.
        unsafe {
            matmul::gemm(
                isa,
                mk.m,
                mk.n,
                mk.k,
                am,
                BSrc::Mat(bm),
                mk.alpha,
                o,
                scratch,
                par,
                threads,
            )
        }
    };
    if mk.per_matrix(threads) {
        out.par_chunks_mut(mn)
            .zip(mk.offsets.par_iter())
            .for_each(|(dst, &(oa, ob))| {
                let tid = rayon::current_thread_index().unwrap_or(0) % threads;
                // Thread `tid` owns scratch[tid·per ..][.. per]; a thread runs one matrix at a
                // time and does not yield to rayon inside it.
                one(dst, oa, ob, scratch.get().wrapping_add(tid * per), false);
            });
    } else {
        for (dst, &(oa, ob)) in out.chunks_mut(mn).zip(&mk.offsets) {
            one(dst, oa, ob, scratch.get(), threads > 1);
        }
    }
}

fn binary_kernel(b: &BinaryK, io: &Io) {
    let x = io.inp(0);
    let y = io.inp(1);
    // SAFETY: single output taken once.
    let out = unsafe { io.out(0) };
    let op = b.op;
    if b.same {
        out.par_chunks_mut(CHUNK)
            .zip(x.par_chunks(CHUNK).zip(y.par_chunks(CHUNK)))
            .for_each(|(o, (a, c))| {
                for i in 0..o.len() {
                    o[i] = binary(op, a[i], c[i]);
                }
            });
        return;
    }
    let r = b.out_shape.len();
    if r == 0 {
        out[0] = binary(op, x[0], y[0]);
        return;
    }
    let last = b.out_shape[r - 1].max(1);
    let (sa, sb) = (b.a_st[r - 1], b.b_st[r - 1]);
    par_rows(out, last, |mut row, orow| {
        let (mut oa, mut obb) = (0usize, 0usize);
        for d in (0..r - 1).rev() {
            let i = row % b.out_shape[d];
            row /= b.out_shape[d];
            oa += i * b.a_st[d];
            obb += i * b.b_st[d];
        }
        match (sa, sb) {
            (1, 1) => {
                let (ar, br) = (&x[oa..oa + last], &y[obb..obb + last]);
                for i in 0..last {
                    orow[i] = binary(op, ar[i], br[i]);
                }
            }
            (1, 0) => {
                let (ar, bv) = (&x[oa..oa + last], y[obb]);
                for i in 0..last {
                    orow[i] = binary(op, ar[i], bv);
                }
            }
            (0, 1) => {
                let (av, br) = (x[oa], &y[obb..obb + last]);
                for i in 0..last {
                    orow[i] = binary(op, av, br[i]);
                }
            }
            _ => {
                for (i, o) in orow.iter_mut().enumerate() {
                    *o = binary(op, x[oa + i * sa], y[obb + i * sb]);
                }
            }
        }
    });
}

/// Calls `f(x_row, out_row)` for every row of `len` elements of `x` and `out`, rows taken in
/// parallel blocks of about [`CHUNK`] elements.
#[inline(always)]
fn par_row_pairs(x: &[f32], out: &mut [f32], len: usize, f: impl Fn(&[f32], &mut [f32]) + Sync) {
    let rows_per = (CHUNK / len.max(1)).max(1);
    out.par_chunks_mut(rows_per * len)
        .zip(x.par_chunks(rows_per * len))
        .for_each(|(ob, xb)| {
            for (o, xr) in ob.chunks_mut(len).zip(xb.chunks(len)) {
                f(xr, o);
            }
        });
}

/// Calls `f(row, out_row)` for every row of `last` elements of `out` (`last` ≥ 1), rows
/// taken in parallel blocks of about [`CHUNK`] elements.
#[inline(always)]
fn par_rows(out: &mut [f32], last: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    let rows_per = (CHUNK / last).max(1);
    out.par_chunks_mut(rows_per * last)
        .enumerate()
        .for_each(|(blk, ob)| {
            for (j, orow) in ob.chunks_mut(last).enumerate() {
                f(blk * rows_per + j, orow);
            }
        });
}

fn strided(s: &StridedK, io: &Io) {
    let x = io.inp(0);
    // SAFETY: single output taken once.
    let out = unsafe { io.out(0) };
    let r = s.out_shape.len();
    if r == 0 {
        out[0] = x[s.base as usize];
        return;
    }
    let last = s.out_shape[r - 1];
    if last == 0 || out.is_empty() {
        return;
    }
    let ls = s.strides[r - 1];
    par_rows(out, last, |mut row, orow| {
        let mut off = s.base;
        for d in (0..r - 1).rev() {
            let i = row % s.out_shape[d];
            row /= s.out_shape[d];
            off += i as isize * s.strides[d];
        }
        if ls == 1 {
            let o = off as usize;
            orow.copy_from_slice(&x[o..o + last]);
        } else {
            for (i, v) in orow.iter_mut().enumerate() {
                *v = x[(off + i as isize * ls) as usize];
            }
        }
    });
}

fn softmax(io: &Io, outer: usize, dim: usize, inner: usize) {
    let x = io.inp(0);
    // SAFETY: single output taken once.
    let out = unsafe { io.out(0) };
    if dim == 0 {
        return;
    }
    if inner == 1 {
        par_row_pairs(x, out, dim, |xr, o| {
            let m = xr.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut s = 0.0;
            for (o, &v) in o.iter_mut().zip(xr) {
                *o = exp(v - m);
                s += *o;
            }
            let inv = 1.0 / s;
            o.iter_mut().for_each(|v| *v *= inv);
        });
        return;
    }
    out.par_chunks_mut(dim * inner)
        .zip(x.par_chunks(dim * inner))
        .for_each(|(o, xb)| {
            for i in 0..inner {
                let mut m = f32::NEG_INFINITY;
                for d in 0..dim {
                    m = m.max(xb[d * inner + i]);
                }
                let mut s = 0.0;
                for d in 0..dim {
                    let e = exp(xb[d * inner + i] - m);
                    o[d * inner + i] = e;
                    s += e;
                }
                for d in 0..dim {
                    o[d * inner + i] /= s;
                }
            }
        });
    let _ = outer;
}

/// Valid input range `[lo, hi)` of each window along one dim (dilation 1).
pub(crate) fn window_ranges(
    out: usize,
    inp: usize,
    k: usize,
    s: usize,
    pad: usize,
) -> Vec<(usize, usize)> {
    (0..out)
        .map(|o| {
            let start = (o * s) as isize - pad as isize;
            let lo = start.max(0) as usize;
            let hi = ((start + k as isize).max(0) as usize).min(inp);
            (lo.min(hi), hi)
        })
        .collect()
}

fn pool(p: &PoolK, io: &Io, max: bool) {
    let a = &p.p;
    if a.dilations == [1, 1] && (max || !a.count_include_pad) {
        return pool_fast(p, io, max);
    }
    let x = io.inp(0);
    // SAFETY: single output taken once.
    let out = unsafe { io.out(0) };
    let (h, w) = (p.h as isize, p.w as isize);
    let _ = p.nc;
    out.par_chunks_mut(p.oh * p.ow)
        .zip(x.par_chunks(p.h * p.w))
        .for_each(|(o, i)| {
            for oy in 0..p.oh {
                let y0 = (oy * a.strides[0]) as isize - a.pads[0] as isize;
                for ox in 0..p.ow {
                    let x0 = (ox * a.strides[1]) as isize - a.pads[1] as isize;
                    let mut acc = if max { f32::NEG_INFINITY } else { 0.0 };
                    let mut cnt = 0usize;
                    for ki in 0..a.kernel[0] {
                        let iy = y0 + (ki * a.dilations[0]) as isize;
                        if iy < 0 || iy >= h {
                            continue;
                        }
                        for kj in 0..a.kernel[1] {
                            let ix = x0 + (kj * a.dilations[1]) as isize;
                            if ix < 0 || ix >= w {
                                continue;
                            }
                            let v = i[(iy * w + ix) as usize];
                            if max {
                                acc = acc.max(v);
                            } else {
                                acc += v;
                            }
                            cnt += 1;
                        }
                    }
                    o[oy * p.ow + ox] = if max {
                        acc
                    } else {
                        let div = if a.count_include_pad {
                            // PyTorch: the window clipped to the padded input, padding counted.
                            let ye = (y0 + a.kernel[0] as isize).min(h + a.pads[2] as isize);
                            let xe = (x0 + a.kernel[1] as isize).min(w + a.pads[3] as isize);
                            ((ye - y0) * (xe - x0)) as usize
                        } else {
                            cnt
                        };
                        acc / div.max(1) as f32
                    };
                }
            }
        });
}

/// Pooling with precomputed window ranges: no per-tap bounds branches.
fn pool_fast(p: &PoolK, io: &Io, max: bool) {
    let x = io.inp(0);
    // SAFETY: single output taken once.
    let out = unsafe { io.out(0) };
    let avx2 = Isa::detect() != Isa::Portable;
    out.par_chunks_mut(p.oh * p.ow)
        .zip(x.par_chunks(p.h * p.w))
        .for_each(|(o, i)| {
            #[cfg(target_arch = "x86_64")]
            if avx2 {
                // SAFETY: AVX2 and FMA were detected (every ISA but Portable implies them).
                return unsafe { pool_plane_avx2(p, i, o, max) };
            }
            let _ = avx2;
            pool_plane(p, i, o, max)
        });
}

/// `pool_plane` compiled for AVX2, so that its row loops use 256-bit vectors.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn pool_plane_avx2(p: &PoolK, i: &[f32], o: &mut [f32], max: bool) {
    pool_plane(p, i, o, max)
}

/// One plane of `pool_fast`.
#[inline(always)]
fn pool_plane(p: &PoolK, i: &[f32], o: &mut [f32], max: bool) {
    let a = &p.p;
    let (ys, xs) = (&p.ys, &p.xs);
    let w = p.w;
    const MAXW: usize = 2048;
    let (kx, sx, pl) = (a.kernel[1], a.strides[1], a.pads[1]);
    // Row length that every window fits in, with the left padding in front.
    let padded_len = ((p.ow.max(1) - 1) * sx + kx).max(pl + w);
    // Separable: reduce the window's rows first (contiguous, vectorises), then each
    // output's columns from that one row.
    // Max pooling reduces each row into the middle of a row padded with −∞, filled
    // once per plane: then every window has the same width and needs no clipping or
    // branches (−∞ never wins, so this equals the clipped windows).
    let padded = max && padded_len <= MAXW;
    let mut tmp = [if padded { f32::NEG_INFINITY } else { 0.0 }; MAXW];
    let off = if padded { pl } else { 0 };
    for (oy, &(y0, y1)) in ys.iter().enumerate() {
        let orow = &mut o[oy * p.ow..(oy + 1) * p.ow];
        if off + w <= MAXW && y1 > y0 {
            let t = &mut tmp[off..off + w];
            t.copy_from_slice(&i[y0 * w..(y0 + 1) * w]);
            for r in y0 + 1..y1 {
                let src = &i[r * w..(r + 1) * w];
                if max {
                    t.iter_mut()
                        .zip(src)
                        .for_each(|(a, &b)| *a = if b > *a { b } else { *a });
                } else {
                    t.iter_mut().zip(src).for_each(|(a, &b)| *a += b);
                }
            }
            if padded {
                let pr = &tmp[..padded_len];
                let mx = |a: f32, b: f32| if b > a { b } else { a };
                if (kx, sx) == (3, 2) {
                    // ResNet's stem pool, written out so that it vectorises.
                    let n = orow.len();
                    let pr = &pr[..2 * n + 1];
                    for (ox, v) in orow.iter_mut().enumerate() {
                        *v = mx(mx(pr[2 * ox], pr[2 * ox + 1]), pr[2 * ox + 2]);
                    }
                    continue;
                }
                for (ox, v) in orow.iter_mut().enumerate() {
                    let win = &pr[ox * sx..ox * sx + kx];
                    *v = win[1..]
                        .iter()
                        .fold(win[0], |m, &e| if e > m { e } else { m });
                }
                continue;
            }
            let t = &tmp[..w];
            for (v, &(x0, x1)) in orow.iter_mut().zip(xs) {
                let seg = &t[x0..x1];
                *v = if max {
                    seg.iter()
                        .fold(f32::NEG_INFINITY, |m, &e| if e > m { e } else { m })
                } else {
                    seg.iter().sum::<f32>() / ((y1 - y0) * (x1 - x0)).max(1) as f32
                };
            }
            continue;
        }
        for (v, &(x0, x1)) in orow.iter_mut().zip(xs) {
            if max {
                let mut m = f32::NEG_INFINITY;
                for r in y0..y1 {
                    for &e in &i[r * w + x0..r * w + x1] {
                        m = m.max(e);
                    }
                }
                *v = m;
            } else {
                let mut sum = 0.0;
                for r in y0..y1 {
                    sum += i[r * w + x0..r * w + x1].iter().sum::<f32>();
                }
                *v = sum / ((y1 - y0) * (x1 - x0)).max(1) as f32;
            }
        }
    }
}

fn resize(r: &ResizeK, io: &Io) {
    let x = io.inp(0);
    // SAFETY: single output taken once.
    let out = unsafe { io.out(0) };
    let _ = r.nc;
    out.par_chunks_mut(r.oh * r.ow)
        .zip(x.par_chunks(r.h * r.w))
        .for_each(|(o, i)| resize_plane(r, i, o));
}

/// One plane `i` (`h × w`) resized into `o` (`oh × ow`); also what the importer folds a
/// Resize of a constant with.
pub(crate) fn resize_plane(r: &ResizeK, i: &[f32], o: &mut [f32]) {
    for (oy, &(y0, y1, ly)) in r.ys.iter().enumerate() {
        let orow = &mut o[oy * r.ow..(oy + 1) * r.ow];
        if r.linear {
            let (r0, r1) = (&i[y0 * r.w..(y0 + 1) * r.w], &i[y1 * r.w..(y1 + 1) * r.w]);
            for (v, &(x0, x1, lx)) in orow.iter_mut().zip(&r.xs) {
                let top = r0[x0] * (1.0 - lx) + r0[x1] * lx;
                let bot = r1[x0] * (1.0 - lx) + r1[x1] * lx;
                *v = top * (1.0 - ly) + bot * ly;
            }
        } else {
            let r0 = &i[y0 * r.w..(y0 + 1) * r.w];
            for (v, &(x0, _, _)) in orow.iter_mut().zip(&r.xs) {
                *v = r0[x0];
            }
        }
    }
}
