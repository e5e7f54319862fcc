//! A small SGEMM for convolutions with weights packed once at compile time and no allocation
//! when it runs.
//!
//! `C = A·B` where A (the convolution's weights, `m × k`) is packed at compile time into panels
//! of `MR` rows (`[panel][k][MR]`, zero-padded), and B (`k × n`: the im2col matrix, or the input
//! itself for pointwise convolutions) is read in place through its row stride, `NR` contiguous
//! columns at a time; only a ragged last column block is copied (zero-padded) into a buffer on
//! the stack. The depth is blocked (≤ 128) so that a `kc × NR` block of B stays in L1 while
//! every A panel streams over it; bias, residual and activation are applied to each output tile
//! after its last depth block, while it is still in cache.
//!
//! The micro-kernel is chosen at run time: AVX-512 (8 × 48, masked edges), AVX2 + FMA (6 × 16), or portable
//! code (6 × 16). The packing layout depends on it, so it is fixed when the weights are packed.

use super::math::apply_act;
use crate::ir::Unary;

/// Largest depth block.
const KC: usize = 128;
/// Largest NR of any micro-kernel (sizes the stack buffer for a ragged column block).
const NR_MAX: usize = 48;
const MR_MAX: usize = 8;

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
            Isa::Avx512 => 8,
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
        Self::with_isa(w, groups, m, k, Isa::detect())
    }

    /// Packs for a given micro-kernel (which must be supported by this CPU).
    fn with_isa(w: &[f32], groups: usize, m: usize, k: usize, isa: Isa) -> PackedA {
        let len = packed_len(isa, m, k);
        let mut data = vec![0.0f32; groups * len];
        for (g, dst) in data.chunks_mut(len.max(1)).enumerate().take(groups) {
            // SAFETY: group g's rows are w[g·m·k ..][.. m·k], row-major.
            unsafe { pack_a(isa, w[g * m * k..].as_ptr(), k, 1, m, k, 1.0, dst) };
        }
        PackedA {
            isa,
            m,
            k,
            panels: m.div_ceil(isa.mr()),
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
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.gemm_rows(g, p0, p1, n, BRows::Strided(b, ldb), c, ldc, epi) }
    }

    /// As [`PackedA::gemm`], with B's rows wherever `b` says.
    ///
    /// # Safety
    /// As for `gemm`; every row `r < k` of `b` has `n` readable columns.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm_rows(
        &self,
        g: usize,
        p0: usize,
        p1: usize,
        n: usize,
        b: BRows,
        c: *mut f32,
        ldc: usize,
        epi: &Epi,
    ) {
        let a = self.data[g * packed_len(self.isa, self.m, self.k)..].as_ptr();
        // SAFETY: forwarded; `a` is this group's packing, made for `self.isa`.
        unsafe {
            gemm_packed(
                self.isa, a, self.m, self.k, p0, p1, n, b, c, ldc, false, epi,
            )
        }
    }
}

/// Elements of a packed `m × k` matrix for `isa`'s micro-kernel.
pub(crate) fn packed_len(isa: Isa, m: usize, k: usize) -> usize {
    m.div_ceil(isa.mr()) * k * isa.mr()
}

/// Packs the `m × k` matrix at `a` (element `(r, c)` at `a + r·rs + c·cs`), scaled by `alpha`,
/// into `dst` in the panel layout of `isa` (see [`PackedA`]); padding rows are zero.
///
/// # Safety
/// `a` covers the matrix described by the strides; `dst` has at least `packed_len` elements.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn pack_a(
    isa: Isa,
    a: *const f32,
    rs: usize,
    cs: usize,
    m: usize,
    k: usize,
    alpha: f32,
    dst: &mut [f32],
) {
    let mr = isa.mr();
    let panels = m.div_ceil(mr);
    let kc = depth_block(k);
    let mut k0 = 0;
    while k0 < k {
        let kcur = kc.min(k - k0);
        // Depth block k0 holds every panel's rows for k0..k0+kcur, contiguously.
        let blk = &mut dst[k0 * panels * mr..(k0 + kcur) * panels * mr];
        for p in 0..panels {
            let pan = &mut blk[p * kcur * mr..(p + 1) * kcur * mr];
            let rows = mr.min(m - p * mr);
            for r in 0..mr {
                if r >= rows {
                    pan[r..].iter_mut().step_by(mr).for_each(|v| *v = 0.0);
                    continue;
                }
                // SAFETY: row p·mr + r < m and columns k0..k0+kcur < k are inside `a`.
                let src = unsafe { a.add((p * mr + r) * rs + k0 * cs) };
                for kk in 0..kcur {
                    // SAFETY: as above.
                    pan[kk * mr + r] = alpha * unsafe { *src.add(kk * cs) };
                }
            }
        }
        k0 += kcur;
    }
}

/// Rows `p0·MR .. min(p1·MR, m)` of `C (+)= A·B` with A packed by [`pack_a`] for `isa`, then
/// the epilogue; `acc_c` adds the product to what C holds.
///
/// # Safety
/// As for [`PackedA::gemm`]; `a` is a packing for `isa` (which this CPU supports) of an
/// `m × k` matrix.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_packed(
    isa: Isa,
    a: *const f32,
    m: usize,
    k: usize,
    p0: usize,
    p1: usize,
    n: usize,
    b: BRows,
    c: *mut f32,
    ldc: usize,
    acc_c: bool,
    epi: &Epi,
) {
    let args = Args {
        panels: m.div_ceil(isa.mr()),
        m,
        k,
        p0,
        p1,
        n,
        a,
        b,
        c,
        ldc,
        acc_c,
    };
    // SAFETY: forwarded from the caller's contract; the ISA was detected when packing.
    unsafe {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => x86::gemm_avx512(&args, epi),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => x86::gemm_avx2(&args, epi),
            _ => gemm_body::<6, 16, false>(&args, epi, micro_portable, None),
        }
    }
}

/// Where the rows of B (`k × n`, columns contiguous) are.
#[derive(Clone, Copy)]
pub(crate) enum BRows<'a> {
    /// Row `r` at `ptr + r·ld`.
    Strided(*const f32, usize),
    /// Row `r` at `ptr + offs[r]`: an implicit im2col, whose rows are shifted views of the
    /// input planes.
    Offsets(*const f32, &'a [usize]),
    /// Column panels of [`PANEL`] columns, each `k` rows of `PANEL` floats stored contiguously
    /// (`ptr`, `k`): element `(r, j)` at `ptr + (j / PANEL)·k·PANEL + r·PANEL + j % PANEL`. A
    /// constant B laid out so streams through memory in order (a row-major weight matrix read
    /// 48 columns at a time jumps a whole row per step, which the prefetchers do not follow).
    Panels(*const f32, usize),
}

/// Columns per panel of [`BRows::Panels`]: the widest micro-kernel's NR (a multiple of every
/// kernel's NR, so that no column block straddles two panels).
pub(crate) const PANEL: usize = 48;

// SAFETY: B is only ever read through a BRows, and the callers that share one among tasks
// keep the matrix alive and unwritten until every task is done.
unsafe impl Send for BRows<'_> {}
// SAFETY: as above.
unsafe impl Sync for BRows<'_> {}

/// Bias, residual and activation applied to the output after the product.
pub(crate) struct Epi<'a> {
    /// One value per output row.
    pub bias: Option<&'a [f32]>,
    /// One value per output column (`nn.Linear`'s bias when the rows are tokens), indexed
    /// from the first column passed to the call.
    pub col_bias: Option<&'a [f32]>,
    /// Residual laid out like the output block (same origin and row stride).
    pub res: Option<*const f32>,
    pub act: Option<Unary>,
}

impl Epi<'_> {
    fn any(&self) -> bool {
        self.bias.is_some() || self.col_bias.is_some() || self.res.is_some() || self.act.is_some()
    }
}

struct Args<'a> {
    panels: usize,
    m: usize,
    k: usize,
    p0: usize,
    p1: usize,
    n: usize,
    a: *const f32,
    b: BRows<'a>,
    c: *mut f32,
    ldc: usize,
    /// Accumulate onto C's contents (Gemm's β·C) instead of overwriting it.
    acc_c: bool,
}

/// `(kc, a, b, ldb, c, ldc, accumulate, rows, cols)`: `C (+)= A·B` on a tile. A micro-kernel
/// that masks (`MASKED`) handles `rows ≤ MR`, `cols ≤ NR` itself (and never reads B or touches
/// C outside them); the others get full tiles only.
type Micro = unsafe fn(usize, *const f32, *const f32, usize, *mut f32, usize, bool, usize, usize);
/// A masked micro-kernel that reads B's row `kk` at `b + offs[kk]`, in place:
/// `(kc, a, b, offs, c, ldc, accumulate, rows, cols)`.
type MicroRows =
    unsafe fn(usize, *const f32, *const f32, *const usize, *mut f32, usize, bool, usize, usize);

#[inline(always)]
unsafe fn gemm_body<const MR: usize, const NR: usize, const MASKED: bool>(
    x: &Args,
    epi: &Epi,
    micro: Micro,
    micro_rows: Option<MicroRows>,
) {
    let k = x.k;
    if k == 0 || x.n == 0 {
        return;
    }
    let kc = depth_block(k);
    let mut bbuf = Aligned([0.0f32; KC * NR_MAX]);
    let mut tmp = [0.0f32; MR_MAX * NR_MAX];
    // One depth block of one column block, for every panel: copy (or point at) B's block, then
    // multiply every A panel into the C tiles, with the epilogue after the last depth block.
    let mut block = |k0: usize, j0: usize| {
        let kcur = kc.min(k - k0);
        let (first, last) = (k0 == 0, k0 + kcur == k);
        let accumulate = !first || x.acc_c;
        // SAFETY: (the whole block) every pointer stays inside the ranges of the caller's contract:
        // rows p0·MR..min(p1·MR, m), columns 0..n, depth 0..k.
        unsafe {
            let nr = NR.min(x.n - j0);
            // Copied into an aligned, contiguous panel: B's own rows are rarely aligned
            // and may be far apart; the copy is amortised over every A panel.
            let in_place = match x.b {
                BRows::Strided(b, ldb)
                    if MASKED
                        && ldb.is_multiple_of(16)
                        && (b.add(j0) as usize).is_multiple_of(64) =>
                {
                    // Rows already start on cache lines: read B in place.
                    Some((b.add(k0 * ldb + j0), ldb))
                }
                BRows::Panels(b, kd) if MASKED && j0.is_multiple_of(PANEL) => {
                    Some((b.add((j0 / PANEL) * kd * PANEL + k0 * PANEL), PANEL))
                }
                _ => None,
            };
            // Rows at offsets (implicit GEMM) with a kernel that reads them where they are: no
            // copy (it cost 5–9% of such a GEMM).
            let direct = match (x.b, micro_rows) {
                (BRows::Offsets(b, offs), Some(f)) => Some((f, b.add(j0), offs[k0..].as_ptr())),
                _ => None,
            };
            let (bp, bld) = if direct.is_some() {
                (std::ptr::null(), 0)
            } else if let Some(in_place) = in_place {
                in_place
            } else {
                for kk in 0..kcur {
                    let src = match x.b {
                        BRows::Strided(b, ldb) => b.add((k0 + kk) * ldb + j0),
                        BRows::Offsets(b, offs) => b.add(offs[k0 + kk] + j0),
                        BRows::Panels(b, kd) => {
                            b.add((j0 / PANEL) * kd * PANEL + (k0 + kk) * PANEL + j0 % PANEL)
                        }
                    };
                    let dst = &mut bbuf.0[kk * NR..(kk + 1) * NR];
                    if nr == NR {
                        // Fixed length: a few vector moves instead of a memcpy call.
                        let src = &*(src as *const [f32; NR]);
                        dst.copy_from_slice(src);
                    } else {
                        dst[..nr].copy_from_slice(std::slice::from_raw_parts(src, nr));
                        dst[nr..].fill(0.0);
                    }
                }
                (bbuf.0.as_ptr(), NR)
            };
            for p in x.p0..x.p1 {
                let ap = x.a.add(k0 * x.panels * MR + p * kcur * MR);
                let r0 = p * MR;
                let rows = MR.min(x.m - r0);
                let cp = x.c.add((r0 - x.p0 * MR) * x.ldc + j0);
                if let Some((f, b, offs)) = direct {
                    f(kcur, ap, b, offs, cp, x.ldc, accumulate, rows, nr);
                } else if (rows == MR && nr == NR) || MASKED {
                    micro(kcur, ap, bp, bld, cp, x.ldc, accumulate, rows, nr);
                } else {
                    if accumulate {
                        for r in 0..rows {
                            tmp[r * NR..r * NR + nr]
                                .copy_from_slice(std::slice::from_raw_parts(cp.add(r * x.ldc), nr));
                        }
                    }
                    micro(kcur, ap, bp, bld, tmp.as_mut_ptr(), NR, accumulate, MR, NR);
                    for r in 0..rows {
                        std::slice::from_raw_parts_mut(cp.add(r * x.ldc), nr)
                            .copy_from_slice(&tmp[r * NR..r * NR + nr]);
                    }
                }
                if last && epi.any() {
                    let cb = epi.col_bias.map(|cb| &cb[j0..j0 + nr]);
                    for r in 0..rows {
                        let v = std::slice::from_raw_parts_mut(cp.add(r * x.ldc), nr);
                        let bias = epi.bias.map_or(0.0, |b| b[r0 + r]);
                        let res = epi.res.map(|rp| {
                            std::slice::from_raw_parts(
                                rp.add((r0 - x.p0 * MR + r) * x.ldc + j0),
                                nr,
                            )
                        });
                        if let Some(cb) = cb {
                            v.iter_mut().zip(cb).for_each(|(v, b)| *v += b);
                        }
                        epilogue(v, bias, res, epi.act);
                    }
                }
            }
        }
    };
    // Loop order: with A small enough to stay in L2 (most convolutions), columns outside and
    // depth inside, so that a column block's C tiles stay in L1 across the depth blocks instead
    // of being reloaded from L2 once per depth block; with a large A (the 512-channel layers'
    // 9 MiB of weights), depth outside, so that A streams from L3 once rather than once per
    // column block.
    let a_bytes = (x.p1 - x.p0) * MR * k * 4;
    if a_bytes <= 1 << 20 {
        let mut j0 = 0;
        while j0 < x.n {
            let mut k0 = 0;
            while k0 < k {
                block(k0, j0);
                k0 += kc.min(k - k0);
            }
            j0 += NR;
        }
    } else {
        let mut k0 = 0;
        while k0 < k {
            let mut j0 = 0;
            while j0 < x.n {
                block(k0, j0);
                j0 += NR;
            }
            k0 += kc.min(k - k0);
        }
    }
}

#[repr(align(64))]
struct Aligned<T>(T);

/// The depth block for depth `k`: ≤ `KC`, as even as possible.
fn depth_block(k: usize) -> usize {
    k.div_ceil(k.div_ceil(KC).max(1)).max(1)
}

#[inline(always)]
pub(crate) fn epilogue(v: &mut [f32], b: f32, r: Option<&[f32]>, act: Option<Unary>) {
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

/// One output channel's epilogue for [`copy_epilogue`]: `dst = act(src + (b + res))` row by
/// row, rows of `ow` columns read `lds` apart from `src` (a product block's valid columns) and
/// written `ow` apart (whole output rows).
pub(crate) struct CopyEpilogue<'a> {
    pub src: &'a [f32],
    pub lds: usize,
    pub ow: usize,
    pub b: f32,
    pub res: Option<&'a [f32]>,
    pub act: Option<Unary>,
}

/// Applies `e` into `dst`, compiled for the CPU's vector width.
pub(crate) fn copy_epilogue(isa: Isa, e: &CopyEpilogue, dst: &mut [f32]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512F was detected for this ISA.
        Isa::Avx512 => unsafe { x86::copy_epilogue_avx512(e, dst) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2 and FMA were detected for this ISA.
        Isa::Avx2 => unsafe { x86::copy_epilogue_avx2(e, dst) },
        _ => copy_epilogue_body(e, dst),
    }
}

#[inline(always)]
fn copy_epilogue_body(e: &CopyEpilogue, dst: &mut [f32]) {
    let CopyEpilogue {
        src,
        lds,
        ow,
        b,
        res,
        act,
    } = *e;
    for (y, d) in dst.chunks_mut(ow).enumerate() {
        let s = &src[y * lds..y * lds + d.len()];
        match res {
            Some(r) => {
                let r = &r[y * ow..y * ow + d.len()];
                d.iter_mut()
                    .zip(s)
                    .zip(r)
                    .for_each(|((d, &s), &r)| *d = s + (b + r))
            }
            None => d.iter_mut().zip(s).for_each(|(d, &s)| *d = s + b),
        }
        match act {
            // Written as compares so that they compile to plain vector max/min.
            Some(Unary::Relu) => d
                .iter_mut()
                .for_each(|v| *v = if *v > 0.0 { *v } else { 0.0 }),
            Some(Unary::Relu6) => d.iter_mut().for_each(|v| {
                let x = if *v > 0.0 { *v } else { 0.0 };
                *v = if x < 6.0 { x } else { 6.0 };
            }),
            other => apply_act(other, d),
        }
    }
}

/// Portable 6 × 16 micro-kernel: `C (+)= A·B` for a full tile.
#[allow(clippy::too_many_arguments)]
unsafe fn micro_portable(
    kc: usize,
    a: *const f32,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    _rows: usize,
    _cols: usize,
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
    use super::{copy_epilogue_body, gemm_body, Args, CopyEpilogue, Epi};
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn copy_epilogue_avx512(e: &CopyEpilogue, dst: &mut [f32]) {
        copy_epilogue_body(e, dst)
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn copy_epilogue_avx2(e: &CopyEpilogue, dst: &mut [f32]) {
        copy_epilogue_body(e, dst)
    }

    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn gemm_avx512(x: &Args, epi: &Epi) {
        // SAFETY: forwarded; this function only runs where AVX-512F was detected.
        unsafe { gemm_body::<8, 48, true>(x, epi, micro_avx512, Some(micro_avx512_rows)) }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn gemm_avx2(x: &Args, epi: &Epi) {
        // SAFETY: forwarded; this function only runs where AVX2 and FMA were detected.
        unsafe { gemm_body::<6, 16, false>(x, epi, micro_avx2, None) }
    }

    /// 8 × 48 tile (24 zmm accumulators), or 8 × 32 / 8 × 16 when fewer columns are left; rows and
    /// columns past `rows` / `cols` are masked off (never read from B, never written to C).
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn micro_avx512(
        kc: usize,
        a: *const f32,
        b: *const f32,
        ldb: usize,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
        rows: usize,
        cols: usize,
    ) {
        // SAFETY: forwarded.
        unsafe {
            micro_avx512_any::<false>(
                kc,
                a,
                b,
                ldb,
                std::ptr::null(),
                c,
                ldc,
                accumulate,
                rows,
                cols,
            )
        }
    }

    /// As `micro_avx512`, with B's row `kk` at `b + offs[kk]` (read in place, unaligned).
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn micro_avx512_rows(
        kc: usize,
        a: *const f32,
        b: *const f32,
        offs: *const usize,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
        rows: usize,
        cols: usize,
    ) {
        // SAFETY: forwarded.
        unsafe { micro_avx512_any::<true>(kc, a, b, 0, offs, c, ldc, accumulate, rows, cols) }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn micro_avx512_any<const OFFS: bool>(
        kc: usize,
        a: *const f32,
        b: *const f32,
        ldb: usize,
        offs: *const usize,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
        rows: usize,
        cols: usize,
    ) {
        let mask = |lo: usize| -> __mmask16 {
            let n = cols.saturating_sub(lo).min(16);
            ((1u32 << n) - 1) as __mmask16
        };
        // SAFETY: the caller passes kc rows of A (8 wide) and of B (`cols` valid columns),
        // and a `rows × cols` tile of C; masked lanes are not accessed.
        unsafe {
            let masks = [mask(0), mask(16), mask(32)];
            let (acc, r) = (accumulate, rows);
            match cols {
                1 => return narrow::<1, OFFS>(kc, a, b, ldb, offs, c, ldc, acc, r),
                2 => return narrow::<2, OFFS>(kc, a, b, ldb, offs, c, ldc, acc, r),
                3 => return narrow::<3, OFFS>(kc, a, b, ldb, offs, c, ldc, acc, r),
                4 => return narrow::<4, OFFS>(kc, a, b, ldb, offs, c, ldc, acc, r),
                _ => {}
            }
            if cols <= 16 {
                tile::<1, OFFS>(kc, a, b, ldb, offs, c, ldc, acc, r, masks)
            } else if cols <= 32 {
                tile::<2, OFFS>(kc, a, b, ldb, offs, c, ldc, acc, r, masks)
            } else {
                tile::<3, OFFS>(kc, a, b, ldb, offs, c, ldc, acc, r, masks)
            }
        }
    }

    /// At most 4 columns left: vectorise over the panel's 8 rows instead (one ymm accumulator
    /// per column), instead of computing 16 columns to keep a few.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn narrow<const J: usize, const OFFS: bool>(
        kc: usize,
        a: *const f32,
        b: *const f32,
        ldb: usize,
        offs: *const usize,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
        rows: usize,
    ) {
        // SAFETY: see micro_avx512; B is read only in its first J columns.
        unsafe {
            let mut acc = [_mm256_setzero_ps(); J];
            let mut ap = a;
            let mut bp = b;
            for kk in 0..kc {
                if OFFS {
                    bp = b.add(*offs.add(kk));
                }
                let av = _mm256_loadu_ps(ap);
                for (j, v) in acc.iter_mut().enumerate() {
                    *v = _mm256_fmadd_ps(av, _mm256_set1_ps(*bp.add(j)), *v);
                }
                ap = ap.add(8);
                if !OFFS {
                    bp = bp.add(ldb);
                }
            }
            for (j, v) in acc.iter().enumerate() {
                let mut col = [0.0f32; 8];
                _mm256_storeu_ps(col.as_mut_ptr(), *v);
                for (r, &x) in col.iter().enumerate().take(rows) {
                    let d = c.add(r * ldc + j);
                    *d = if accumulate { *d + x } else { x };
                }
            }
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<const W: usize, const OFFS: bool>(
        kc: usize,
        a: *const f32,
        b: *const f32,
        ldb: usize,
        offs: *const usize,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
        rows: usize,
        masks: [__mmask16; 3],
    ) {
        const MR: usize = 8;
        // SAFETY: see micro_avx512.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); W]; MR];
            if accumulate {
                for (r, v) in acc.iter_mut().enumerate().take(rows) {
                    for (w, v) in v.iter_mut().enumerate() {
                        *v = _mm512_maskz_loadu_ps(masks[w], c.add(r * ldc + 16 * w));
                    }
                }
            }
            let mut ap = a;
            let mut bp = b;
            for kk in 0..kc {
                if OFFS {
                    bp = b.add(*offs.add(kk));
                }
                let mut bv = [_mm512_setzero_ps(); W];
                for (w, v) in bv.iter_mut().enumerate() {
                    *v = _mm512_maskz_loadu_ps(masks[w], bp.add(16 * w));
                }
                for (r, v) in acc.iter_mut().enumerate() {
                    let av = _mm512_set1_ps(*ap.add(r));
                    for (w, v) in v.iter_mut().enumerate() {
                        *v = _mm512_fmadd_ps(av, bv[w], *v);
                    }
                }
                ap = ap.add(MR);
                if !OFFS {
                    bp = bp.add(ldb);
                }
            }
            for (r, v) in acc.iter().enumerate().take(rows) {
                for (w, v) in v.iter().enumerate() {
                    _mm512_mask_storeu_ps(c.add(r * ldc + 16 * w), masks[w], *v);
                }
            }
        }
    }

    /// 6 × 16 tile: 12 ymm accumulators.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn micro_avx2(
        kc: usize,
        a: *const f32,
        b: *const f32,
        ldb: usize,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
        _rows: usize,
        _cols: usize,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every micro-kernel this CPU supports against a plain triple loop: ragged rows, columns
    /// and depth blocks, groups, a sub-range of panels, bias + residual + ReLU.
    #[test]
    fn packed_gemm_matches_reference() {
        let mut isas = vec![Isa::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                isas.push(Isa::Avx2);
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                isas.push(Isa::Avx512);
            }
        }
        for isa in isas {
            for &(groups, m, k, n, ldb) in &[
                (1, 64, 576, 112, 112),
                (2, 13, 300, 49, 64),
                (1, 20, 7, 3, 5),
                (1, 9, 129, 50, 53),
                (3, 8, 16, 97, 97),
            ] {
                let w: Vec<f32> = (0..groups * m * k)
                    .map(|i| ((i * 7 % 23) as f32 - 11.0) / 11.0)
                    .collect();
                let b: Vec<f32> = (0..k * ldb)
                    .map(|i| ((i * 5 % 19) as f32 - 9.0) / 9.0)
                    .collect();
                let bias: Vec<f32> = (0..m).map(|i| i as f32 * 0.1 - 0.5).collect();
                let res: Vec<f32> = (0..m * n).map(|i| ((i % 7) as f32 - 3.0) * 0.2).collect();
                let pa = PackedA::with_isa(&w, groups, m, k, isa);
                let mr = isa.mr();
                let check = |c: &[f32], g: usize, r0: usize, by_offsets: bool| {
                    for r in r0..m {
                        for j in 0..n {
                            let mut acc = 0.0f64;
                            for kk in 0..k {
                                acc += w[(g * m + r) * k + kk] as f64 * b[kk * ldb + j] as f64;
                            }
                            let want = (acc as f32 + bias[r] + res[r * n + j]).max(0.0);
                            let got = c[(r - r0) * n + j];
                            assert!(
                                (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                                "{isa:?} offsets {by_offsets} g{g} {m}x{k}x{n}: [{r}][{j}] = {got}, want {want}"
                            );
                        }
                    }
                };
                for g in 0..groups {
                    // Panels from 1 on when there are several (a thread's share), else all.
                    let p0 = usize::from(pa.panels > 1);
                    let r0 = p0 * mr;
                    let mut c = vec![f32::NAN; (m - r0) * n];
                    let epi = Epi {
                        bias: Some(&bias),
                        col_bias: None,
                        res: Some(res[r0 * n..].as_ptr()),
                        act: Some(Unary::Relu),
                    };
                    // B's rows through an offset table too (the implicit-GEMM path, read in
                    // place by the AVX-512 kernel), as every row's start: the same matrix.
                    let offs: Vec<usize> = (0..k).map(|r| r * ldb).collect();
                    for by_offsets in [false, true] {
                        c.fill(f32::NAN);
                        let rows = if by_offsets {
                            BRows::Offsets(b.as_ptr(), &offs)
                        } else {
                            BRows::Strided(b.as_ptr(), ldb)
                        };
                        // SAFETY: all buffers sized as the contract asks.
                        unsafe { pa.gemm_rows(g, p0, pa.panels, n, rows, c.as_mut_ptr(), n, &epi) };
                        check(&c, g, r0, by_offsets);
                    }
                }
            }
        }
    }
}
