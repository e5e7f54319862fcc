//! A small SGEMM for convolutions with weights packed once at compile time and no allocation
//! when it runs.
//!
//! `C = A·B` where A (the convolution's weights, `m × k`) is packed at compile time into panels
//! of `MR` rows (`[panel][k][MR]`, zero-padded), and B (`k × n`: the im2col matrix, or the input
//! itself for pointwise convolutions) is read in place through its row stride, `NR` contiguous
//! columns at a time; only a ragged last column block is copied (zero-padded) into a buffer on
//! the stack. The depth is blocked (≤ 256) so that a `kc × NR` block of B stays in L1 while
//! every A panel streams over it; bias, residual and activation are applied to each output tile
//! after its last depth block, while it is still in cache.
//!
//! The micro-kernel is chosen at run time: AVX-512 (12 × 32), AVX2 + FMA (6 × 16), or portable
//! code (6 × 16). The packing layout depends on it, so it is fixed when the weights are packed.

use super::kernels::apply_act;
use crate::ir::Unary;

/// Largest depth block.
const KC: usize = 256;
/// Largest NR of any micro-kernel (sizes the stack buffer for a ragged column block).
const NR_MAX: usize = 32;
const MR_MAX: usize = 12;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    Avx512,
    Avx2,
    Portable,
}

impl Isa {
    pub fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    }
    pub fn mr(self) -> usize {
        match self {
            Isa::Avx512 => 12,
            Isa::Avx2 | Isa::Portable => 6,
        }
    }
}

/// A weight matrix per group (`groups × m × k`), packed into `MR`-row panels.
pub(crate) struct PackedA {
    pub isa: Isa,
    /// Rows per group.
    pub m: usize,
    pub k: usize,
    /// Panels per group.
    pub panels: usize,
    data: Vec<f32>,
}

impl std::fmt::Debug for PackedA {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PackedA {{ {:?}, m {}, k {}, panels {} }}",
            self.isa, self.m, self.k, self.panels
        )
    }
}

impl PackedA {
    /// Packs `w` (`groups × m × k`, row-major).
    pub fn new(w: &[f32], groups: usize, m: usize, k: usize) -> PackedA {
        let isa = Isa::detect();
        let mr = isa.mr();
        let panels = m.div_ceil(mr);
        let mut data = vec![0.0f32; groups * panels * k * mr];
        for g in 0..groups {
            for r in 0..m {
                let (p, ri) = (r / mr, r % mr);
                let src = &w[(g * m + r) * k..(g * m + r + 1) * k];
                let base = (g * panels + p) * k * mr;
                for (kk, &v) in src.iter().enumerate() {
                    data[base + kk * mr + ri] = v;
                }
            }
        }
        PackedA {
            isa,
            m,
            k,
            panels,
            data,
        }
    }

    /// Rows `p0·MR .. min(p1·MR, m)` of group `g`'s output: `C = A·B`, then the epilogue.
    ///
    /// # Safety
    /// `b` covers `k × n` with row stride `ldb` (columns contiguous); `c` points at row `p0·MR`
    /// of the group's output and covers those rows × `n` with row stride `ldc`; `epi.res`, if
    /// any, is laid out like `c`; `epi.bias` has the group's `m` entries. `c` overlaps neither.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm(
        &self,
        g: usize,
        p0: usize,
        p1: usize,
        n: usize,
        b: *const f32,
        ldb: usize,
        c: *mut f32,
        ldc: usize,
        epi: &Epi,
    ) {
        let a = self.data[g * self.panels * self.k * self.isa.mr()..].as_ptr();
        let args = Args {
            m: self.m,
            k: self.k,
            p0,
            p1,
            n,
            a,
            b,
            ldb,
            c,
            ldc,
        };
        // SAFETY: forwarded from the caller's contract; the ISA was detected when packing.
        unsafe {
            match self.isa {
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 => x86::gemm_avx512(&args, epi),
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => x86::gemm_avx2(&args, epi),
                _ => gemm_body::<6, 16>(&args, epi, micro_portable),
            }
        }
    }
}

/// Bias, residual and activation applied to the output after the product.
pub(crate) struct Epi<'a> {
    pub bias: Option<&'a [f32]>,
    /// Residual laid out like the output block (same origin and row stride).
    pub res: Option<*const f32>,
    pub act: Option<Unary>,
}

impl Epi<'_> {
    fn any(&self) -> bool {
        self.bias.is_some() || self.res.is_some() || self.act.is_some()
    }
}

struct Args {
    m: usize,
    k: usize,
    p0: usize,
    p1: usize,
    n: usize,
    a: *const f32,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
}

type Micro = unsafe fn(usize, *const f32, *const f32, usize, *mut f32, usize, bool);

#[inline(always)]
unsafe fn gemm_body<const MR: usize, const NR: usize>(x: &Args, epi: &Epi, micro: Micro) {
    let k = x.k;
    if k == 0 || x.n == 0 {
        return;
    }
    let blocks = k.div_ceil(KC);
    let kc = k.div_ceil(blocks);
    let mut bbuf = [0.0f32; KC * NR_MAX];
    let mut tmp = [0.0f32; MR_MAX * NR_MAX];
    let mut k0 = 0;
    // SAFETY (whole body): every pointer stays inside the ranges of the caller's contract:
    // rows p0·MR..min(p1·MR, m), columns 0..n, depth 0..k.
    unsafe {
        while k0 < k {
            let kcur = kc.min(k - k0);
            let (first, last) = (k0 == 0, k0 + kcur == k);
            let mut j0 = 0;
            while j0 < x.n {
                let nr = NR.min(x.n - j0);
                let (bp, bld) = if nr == NR {
                    (x.b.add(k0 * x.ldb + j0), x.ldb)
                } else {
                    for kk in 0..kcur {
                        let src = std::slice::from_raw_parts(x.b.add((k0 + kk) * x.ldb + j0), nr);
                        let dst = &mut bbuf[kk * NR..(kk + 1) * NR];
                        dst[..nr].copy_from_slice(src);
                        dst[nr..].fill(0.0);
                    }
                    (bbuf.as_ptr(), NR)
                };
                for p in x.p0..x.p1 {
                    let ap = x.a.add(p * k * MR + k0 * MR);
                    let r0 = p * MR;
                    let rows = MR.min(x.m - r0);
                    let cp = x.c.add((r0 - x.p0 * MR) * x.ldc + j0);
                    if rows == MR && nr == NR {
                        micro(kcur, ap, bp, bld, cp, x.ldc, !first);
                    } else {
                        if !first {
                            for r in 0..rows {
                                tmp[r * NR..r * NR + nr].copy_from_slice(
                                    std::slice::from_raw_parts(cp.add(r * x.ldc), nr),
                                );
                            }
                        }
                        micro(kcur, ap, bp, bld, tmp.as_mut_ptr(), NR, !first);
                        for r in 0..rows {
                            std::slice::from_raw_parts_mut(cp.add(r * x.ldc), nr)
                                .copy_from_slice(&tmp[r * NR..r * NR + nr]);
                        }
                    }
                    if last && epi.any() {
                        for r in 0..rows {
                            let v = std::slice::from_raw_parts_mut(cp.add(r * x.ldc), nr);
                            let bias = epi.bias.map_or(0.0, |b| b[r0 + r]);
                            let res = epi.res.map(|rp| {
                                std::slice::from_raw_parts(
                                    rp.add((r0 - x.p0 * MR + r) * x.ldc + j0),
                                    nr,
                                )
                            });
                            epilogue(v, bias, res, epi.act);
                        }
                    }
                }
                j0 += NR;
            }
            k0 += kcur;
        }
    }
}

#[inline(always)]
fn epilogue(v: &mut [f32], b: f32, r: Option<&[f32]>, act: Option<Unary>) {
    if let Some(r) = r {
        v.iter_mut().zip(r).for_each(|(v, r)| *v += b + r);
    } else if b != 0.0 {
        v.iter_mut().for_each(|v| *v += b);
    }
    match act {
        Some(Unary::Relu) => v.iter_mut().for_each(|v| *v = v.max(0.0)),
        Some(Unary::Relu6) => v.iter_mut().for_each(|v| *v = v.clamp(0.0, 6.0)),
        other => apply_act(other, v),
    }
}

/// Portable 6 × 16 micro-kernel: `C (+)= A·B` for a full tile.
unsafe fn micro_portable(
    kc: usize,
    a: *const f32,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    const MR: usize = 6;
    const NR: usize = 16;
    let mut acc = [[0.0f32; NR]; MR];
    // SAFETY: the caller passes a full MR × NR tile and kc rows of A and B.
    unsafe {
        if accumulate {
            for (r, row) in acc.iter_mut().enumerate() {
                row.copy_from_slice(std::slice::from_raw_parts(c.add(r * ldc), NR));
            }
        }
        for kk in 0..kc {
            let bv = std::slice::from_raw_parts(b.add(kk * ldb), NR);
            let av = std::slice::from_raw_parts(a.add(kk * MR), MR);
            for (row, &ar) in acc.iter_mut().zip(av) {
                for (o, &bj) in row.iter_mut().zip(bv) {
                    *o += ar * bj;
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            std::slice::from_raw_parts_mut(c.add(r * ldc), NR).copy_from_slice(row);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{gemm_body, Args, Epi};
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f,fma")]
    pub(super) unsafe fn gemm_avx512(x: &Args, epi: &Epi) {
        // SAFETY: forwarded; this function only runs where AVX-512F was detected.
        unsafe { gemm_body::<12, 32>(x, epi, micro_avx512) }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn gemm_avx2(x: &Args, epi: &Epi) {
        // SAFETY: forwarded; this function only runs where AVX2 and FMA were detected.
        unsafe { gemm_body::<6, 16>(x, epi, micro_avx2) }
    }

    /// 12 × 32 tile: 24 zmm accumulators.
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn micro_avx512(
        kc: usize,
        a: *const f32,
        b: *const f32,
        ldb: usize,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
        const MR: usize = 12;
        // SAFETY: the caller passes a full 12 × 32 tile of C and kc rows of A (12 wide) and B.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); 2]; MR];
            if accumulate {
                for (r, v) in acc.iter_mut().enumerate() {
                    v[0] = _mm512_loadu_ps(c.add(r * ldc));
                    v[1] = _mm512_loadu_ps(c.add(r * ldc + 16));
                }
            }
            let mut ap = a;
            let mut bp = b;
            for _ in 0..kc {
                let b0 = _mm512_loadu_ps(bp);
                let b1 = _mm512_loadu_ps(bp.add(16));
                for (r, v) in acc.iter_mut().enumerate() {
                    let av = _mm512_set1_ps(*ap.add(r));
                    v[0] = _mm512_fmadd_ps(av, b0, v[0]);
                    v[1] = _mm512_fmadd_ps(av, b1, v[1]);
                }
                ap = ap.add(MR);
                bp = bp.add(ldb);
            }
            for (r, v) in acc.iter().enumerate() {
                _mm512_storeu_ps(c.add(r * ldc), v[0]);
                _mm512_storeu_ps(c.add(r * ldc + 16), v[1]);
            }
        }
    }

    /// 6 × 16 tile: 12 ymm accumulators.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn micro_avx2(
        kc: usize,
        a: *const f32,
        b: *const f32,
        ldb: usize,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
        const MR: usize = 6;
        // SAFETY: the caller passes a full 6 × 16 tile of C and kc rows of A (6 wide) and B.
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); 2]; MR];
            if accumulate {
                for (r, v) in acc.iter_mut().enumerate() {
                    v[0] = _mm256_loadu_ps(c.add(r * ldc));
                    v[1] = _mm256_loadu_ps(c.add(r * ldc + 8));
                }
            }
            let mut ap = a;
            let mut bp = b;
            for _ in 0..kc {
                let b0 = _mm256_loadu_ps(bp);
                let b1 = _mm256_loadu_ps(bp.add(8));
                for (r, v) in acc.iter_mut().enumerate() {
                    let av = _mm256_set1_ps(*ap.add(r));
                    v[0] = _mm256_fmadd_ps(av, b0, v[0]);
                    v[1] = _mm256_fmadd_ps(av, b1, v[1]);
                }
                ap = ap.add(MR);
                bp = bp.add(ldb);
            }
            for (r, v) in acc.iter().enumerate() {
                _mm256_storeu_ps(c.add(r * ldc), v[0]);
                _mm256_storeu_ps(c.add(r * ldc + 8), v[1]);
            }
        }
    }
}
