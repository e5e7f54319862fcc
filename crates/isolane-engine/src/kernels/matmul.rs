//! Matrix products of activations (MatMul, Gemm, Linear) on the packed micro-kernels, with
//! every buffer planned at compile time: the left matrix is packed at run time into the model's
//! scratch, a constant right matrix (Linear's weight) is packed once at compile time, and a
//! right matrix whose rows are not contiguous (attention's Kᵀ) is copied into the scratch.
//! Nothing here allocates (the `gemm` crate allocates packing buffers on every call).

use rayon::prelude::*;

use super::math::SharedMut;
use super::packed::{gemm_packed, pack_a, packed_len, BRows, Epi, Isa, PANEL};
use crate::ir::Unary;

/// A `rows × cols` matrix at `ptr` with element `(r, c)` at `ptr + r·rs + c·cs`.
#[derive(Clone, Copy)]
pub(crate) struct Mat {
    pub ptr: *const f32,
    pub rs: usize,
    pub cs: usize,
}

// SAFETY: a Mat is a read-only view; callers that share one among tasks keep the matrix
// alive and unwritten until every task is done.
unsafe impl Send for Mat {}
// SAFETY: as above.
unsafe impl Sync for Mat {}

/// A constant right-hand matrix `k × n` in column panels ([`BRows::Panels`]) starting on a cache
/// line, so that the AVX-512 kernel reads it in place and in memory order.
pub(crate) struct PackedB {
    buf: Vec<f32>,
    off: usize,
    pub k: usize,
    pub n: usize,
}

impl std::fmt::Debug for PackedB {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedB {{ k {}, n {} }}", self.k, self.n)
    }
}

impl PackedB {
    /// `Wᵀ` for an `nn.Linear` weight `w` (`n × k`, row-major).
    pub fn from_linear_weight(w: &[f32], n: usize, k: usize) -> PackedB {
        let panels = n.div_ceil(PANEL);
        let mut buf = vec![0.0f32; panels * k * PANEL + 16];
        let off = buf.as_ptr().align_offset(64).min(16);
        for (j, row) in w.chunks_exact(k.max(1)).take(n).enumerate() {
            let base = off + (j / PANEL) * k * PANEL + j % PANEL;
            for (kk, &v) in row.iter().enumerate() {
                buf[base + kk * PANEL] = v;
            }
        }
        PackedB { buf, off, k, n }
    }

    fn ptr(&self) -> *const f32 {
        self.buf[self.off..].as_ptr()
    }
}

/// Where B comes from.
#[derive(Clone, Copy)]
pub(crate) enum BSrc<'a> {
    Packed(&'a PackedB),
    Mat(Mat),
}

/// Floats of scratch one product `m × k · k × n` needs (the packed A, then B when its rows are
/// not contiguous).
pub(crate) fn scratch_len(isa: Isa, m: usize, n: usize, k: usize, b_contiguous: bool) -> usize {
    let a = packed_len(isa, m, k).next_multiple_of(16);
    let b = if b_contiguous {
        0
    } else {
        k * n.next_multiple_of(16)
    };
    a + b
}

/// Output-side options of a product.
#[derive(Clone, Copy)]
pub(crate) struct Out<'a> {
    pub c: *mut f32,
    pub ldc: usize,
    /// Add to what C holds (Gemm's β·C, written there beforehand).
    pub acc_c: bool,
    /// Added to every row (nn.Linear's bias), `n` values.
    pub col_bias: Option<&'a [f32]>,
    pub act: Option<Unary>,
}

// SAFETY: tasks sharing an Out write disjoint blocks of C (see `gemm`).
unsafe impl Send for Out<'_> {}
// SAFETY: as above.
unsafe impl Sync for Out<'_> {}

/// `C (+)= alpha·A·B`, then the column bias and the activation. With `par`, the product is
/// split among the current rayon pool's threads (`threads` of them).
///
/// # Safety
/// `a` covers `m × k`, B covers `k × n`, `out.c` covers `m` rows of `n` with stride `ldc` and
/// overlaps neither; `scratch` holds `scratch_len(isa, m, n, k, B contiguous)` floats that no
/// one else touches meanwhile.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm(
    isa: Isa,
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: BSrc,
    alpha: f32,
    out: Out,
    scratch: *mut f32,
    par: bool,
    threads: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        // An empty sum: the product is zero; the epilogue still applies.
        for r in 0..m {
            // SAFETY: row r of C is inside the caller's m × n block.
            let row = unsafe { std::slice::from_raw_parts_mut(out.c.add(r * out.ldc), n) };
            if !out.acc_c {
                row.fill(0.0);
            }
            if let Some(cb) = out.col_bias {
                row.iter_mut().zip(cb).for_each(|(v, b)| *v += b);
            }
            super::math::apply_act(out.act, row);
        }
        return;
    }
    let threads = threads.max(1);
    // Rows of B as (first row, row stride, panel stride): a row-major B is one panel.
    let row_b = match b {
        BSrc::Packed(pb) => Some((pb.ptr(), PANEL, k * PANEL)),
        BSrc::Mat(bm) if bm.cs == 1 => Some((bm.ptr, bm.rs, 0)),
        BSrc::Mat(_) => None,
    };
    if let (true, Some((bp, ldb, pstride))) = (m <= GEMV_ROWS, row_b) {
        // A few rows (a classifier head at batch 1): stream B once, in memory order; the GEMM
        // would fill 8-row panels for 1 row.
        let chunks = if par && threads > 1 {
            (2 * threads).min(n.div_ceil(PANEL))
        } else {
            1
        };
        let cw = n.div_ceil(PANEL).div_ceil(chunks) * PANEL;
        let bp = SharedMut(bp as *mut f32);
        let rows = Gemv {
            m,
            k,
            a,
            ldb,
            alpha,
            out,
        };
        let task = |ci: usize| {
            let (j0, j1) = (ci * cw, ((ci + 1) * cw).min(n));
            // One panel (or, row-major, one row segment) at a time.
            let step = if pstride == 0 {
                j1.saturating_sub(j0)
            } else {
                PANEL
            };
            let mut j = j0;
            while j < j1 {
                let je = (j + step).min(j1);
                let first = if pstride == 0 {
                    bp.get().wrapping_add(j)
                } else {
                    bp.get().wrapping_add((j / PANEL) * pstride)
                };
                // SAFETY: columns j..je of C are this task's alone; B's rows have them at
                // `first + r·ldb`.
                unsafe { gemv(isa, rows, first, j, je) };
                j = je;
            }
        };
        if chunks > 1 {
            (0..chunks).into_par_iter().for_each(task);
        } else {
            task(0);
        }
        return;
    }
    let alen = packed_len(isa, m, k).next_multiple_of(16);
    // SAFETY: the scratch holds the packed A first, then (if needed) B; sizes per scratch_len.
    let (ap, brows) = unsafe {
        let ap = std::slice::from_raw_parts_mut(scratch, packed_len(isa, m, k));
        pack_a(isa, a.ptr, a.rs, a.cs, m, k, alpha, ap);
        let brows = match b {
            BSrc::Packed(pb) => BRows::Panels(pb.ptr(), k),
            BSrc::Mat(bm) if bm.cs == 1 => BRows::Strided(bm.ptr, bm.rs),
            BSrc::Mat(bm) => {
                let ld = n.next_multiple_of(16);
                let bp = std::slice::from_raw_parts_mut(scratch.add(alen), k * ld);
                for (kk, row) in bp.chunks_exact_mut(ld).enumerate() {
                    for (j, v) in row[..n].iter_mut().enumerate() {
                        *v = *bm.ptr.add(kk * bm.rs + j * bm.cs);
                    }
                }
                BRows::Strided(bp.as_ptr(), ld)
            }
        };
        (ap.as_ptr(), brows)
    };
    let mr = isa.mr();
    let panels = m.div_ceil(mr);
    // Tasks: column chunks (whole 48-column blocks, so B stays aligned) × panel chunks.
    let cblocks = n.div_ceil(48);
    let (cc, pc) = if par && threads > 1 {
        let cc = cblocks.min(2 * threads);
        (cc, panels.min((2 * threads).div_ceil(cc)))
    } else {
        (1, 1)
    };
    let cw = cblocks.div_ceil(cc) * 48;
    let pw = panels.div_ceil(pc);
    let c = SharedMut(out.c);
    let ap = SharedMut(ap as *mut f32);
    let task = |t: usize| {
        let (ci, pi) = (t / pc, t % pc);
        let (j0, p0) = (ci * cw, pi * pw);
        let (j1, p1) = ((j0 + cw).min(n), (p0 + pw).min(panels));
        if j0 >= j1 || p0 >= p1 {
            return;
        }
        let b = match brows {
            // SAFETY: column j0 of every row is inside B.
            BRows::Strided(p, ld) => BRows::Strided(unsafe { p.add(j0) }, ld),
            // SAFETY: j0 is a multiple of PANEL (cw is), so this is panel j0 / PANEL.
            BRows::Panels(p, kd) => BRows::Panels(unsafe { p.add(j0 / PANEL * kd * PANEL) }, kd),
            other => other,
        };
        let epi = Epi {
            bias: None,
            col_bias: out.col_bias.map(|cb| &cb[j0..j1]),
            res: None,
            act: out.act,
        };
        // SAFETY: rows p0·MR.. and columns j0..j1 of C are this task's alone; A is packed for
        // `isa`; B's rows have ≥ j1 columns.
        unsafe {
            gemm_packed(
                isa,
                ap.get(),
                m,
                k,
                p0,
                p1,
                j1 - j0,
                b,
                c.get().add(p0 * mr * out.ldc + j0),
                out.ldc,
                out.acc_c,
                &epi,
            )
        };
    };
    if cc * pc > 1 {
        (0..cc * pc).into_par_iter().for_each(task);
    } else {
        task(0);
    }
}

/// Rows up to which a product is computed as row × matrix products.
const GEMV_ROWS: usize = 2;

/// A product of a few rows of A (at most [`GEMV_ROWS`]): `C (+)= alpha·A·B` into
/// `out`, then its column bias and activation; B's rows are `ldb` apart.
#[derive(Clone, Copy)]
struct Gemv<'a> {
    m: usize,
    k: usize,
    a: Mat,
    ldb: usize,
    alpha: f32,
    out: Out<'a>,
}

/// Columns `j0..j1` of the product `g`; `b` points at B's element `(0, j0)`.
///
/// # Safety
/// As for [`gemm`]; columns `j0..j1` of C are the caller's alone.
unsafe fn gemv(isa: Isa, g: Gemv, b: *const f32, j0: usize, j1: usize) {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Portable {
        // SAFETY: AVX2 and FMA were detected (every ISA but Portable implies them).
        return unsafe { gemv_avx2(g, b, j0, j1) };
    }
    let _ = isa;
    // SAFETY: forwarded.
    unsafe { gemv_body(g, b, j0, j1) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gemv_avx2(g: Gemv, b: *const f32, j0: usize, j1: usize) {
    // SAFETY: forwarded; compiled here with AVX2 so that the row loops vectorise to 256 bits.
    unsafe { gemv_body(g, b, j0, j1) }
}

#[inline(always)]
unsafe fn gemv_body(g: Gemv, b: *const f32, j0: usize, j1: usize) {
    let Gemv {
        m,
        k,
        a,
        ldb,
        alpha,
        out,
    } = g;
    let c = out.c;
    let w = j1 - j0;
    // SAFETY: (the whole body) rows < m ≤ GEMV_ROWS of C and A, rows < k of B, columns j0..j1.
    unsafe {
        for r in 0..m {
            let row = std::slice::from_raw_parts_mut(c.add(r * out.ldc + j0), w);
            if !out.acc_c {
                row.fill(0.0);
            }
            for kk in 0..k {
                let s = alpha * *a.ptr.add(r * a.rs + kk * a.cs);
                let brow = std::slice::from_raw_parts(b.add(kk * ldb), w);
                row.iter_mut().zip(brow).for_each(|(o, &x)| *o += s * x);
            }
            if let Some(cb) = out.col_bias {
                row.iter_mut().zip(&cb[j0..j1]).for_each(|(v, b)| *v += b);
            }
            super::math::apply_act(out.act, row);
        }
    }
}
