//! The NVRTC kernels: everything that is not a convolution or a matrix product.
//!
//! One source per activation dtype, generated here (no CUDA headers: half and bfloat16 are
//! converted with inline PTX, so NVRTC needs no include path), compiled once per (source,
//! GPU architecture, NVRTC version) and cached on disk as a cubin. Every kernel loads its
//! operands as the storage dtype, computes in f32 and stores back, and walks its elements with
//! a grid-stride loop so that one launch shape fits every size.

use std::path::{Path, PathBuf};

use crate::plan::{DType, MAX_RANK};

/// Threads per block of the elementwise kernels.
pub const BLOCK: u32 = 256;

/// Kernel names in the module (the Rust side looks them up by these names).
pub const KERNEL_NAMES: &[&str] = &[
    "cast_in",
    "cast_out",
    "pointwise",
    "binary",
    "copy_strided",
    "layernorm",
    "softmax",
    "pool2d",
    "row_reduce",
    "adaptive_pool",
    "resize2d",
    "dwconv",
    "chan_mean",
    "chan_mean_rows",
    "im2col",
    "dwconv_s1_k3",
    "dwconv_s1_k7",
    "layernorm_warp4",
    "layernorm_warp8",
    "layernorm_warp16",
    "layernorm_warp32",
    "softmax_warp4",
    "softmax_warp8",
    "softmax_warp16",
    "softmax_warp32",
    "copy_w4",
    "copy_w8",
    "copy_w16",
    "dwconv_c2_k7",
    "pointwise_v",
    "pool2d_v",
    "im2col_v",
    "dwconv_v_k3_s1_o2",
    "dwconv_v_k3_s1_o4",
    "dwconv_v_k3_s2_o1",
    "dwconv_v_k3_s2_o2",
    "dwconv_v_k5_s1_o2",
    "dwconv_v_k5_s2_o1",
    "dwconv_v_k7_s1_o2",
    "layernorm_wv1",
    "layernorm_wv2",
    "layernorm_wv3",
    "layernorm_wv4",
    "layernorm_wv6",
    "layernorm_wv8",
    "fake_quant",
    "quantize_q8",
    "dequant_epilogue",
    "im2col_b4",
    "qgemm_fallback",
    "dequantize_q8",
    "pool2d_q8",
    "pool2d_v_q8",
    "cast_in_nhwc",
];

/// The name of the module's kernel number `func` (the order the model loads them in:
/// [`KERNEL_NAMES`], then [`HALF_KERNEL_NAMES`]).
pub fn kernel_name(func: usize) -> Option<&'static str> {
    KERNEL_NAMES
        .iter()
        .chain(HALF_KERNEL_NAMES)
        .nth(func)
        .copied()
}

/// 16-byte vectors per lane of the `layernorm_wv{N}` kernels (one warp per row of at most
/// 32 · N vectors).
pub const LN_VEC_PER_LANE: &[usize] = &[1, 2, 3, 4, 6, 8];

/// Kernels only in the f16 / bf16 modules (tensor-core `mma.sync`, sm_80 and newer).
pub const HALF_KERNEL_NAMES: &[&str] = &[
    "attention",
    "qgemm_i8",
    "qgemm_f8",
    "qgemm_i8_wg",
    "conv_stem_n64",
    "conv_stem_n128",
];

/// Head dimension of the fused attention kernel.
pub const ATTN_HEAD_DIM: usize = 64;
/// Outputs along a row per thread of the `dwconv_c2_*` kernels (2 channels each).
pub const DWC2_OUT: usize = 8;
/// The vectorised depthwise kernels (`dwconv_v_k{KW}_s{SW}_o{OUTS}`): kernel width, horizontal stride
/// and outputs along a row per thread (register window (OUTS − 1) · SW + KW inputs of 16 bytes).
pub const DW_VEC_SHAPES: &[(usize, usize, usize)] = &[
    (3, 1, 2),
    (3, 1, 4),
    (3, 2, 1),
    (3, 2, 2),
    (5, 1, 2),
    (5, 2, 1),
    (7, 1, 2),
];

/// The name of the vectorised depthwise kernel of a [`DW_VEC_SHAPES`] entry.
pub fn dw_vec_name(kw: usize, sw: usize, outs: usize) -> String {
    format!("dwconv_v_k{kw}_s{sw}_o{outs}")
}

/// Bytes of one vector access of the `*_v` kernels (VW elements: 4 f32 or 8 f16/bf16).
pub const VEC_BYTES: usize = 16;

/// Query rows of each warp of the fused attention kernel.
pub const ATTN_WARP_ROWS: usize = 16;
/// Block shapes the fused attention kernel is timed with: (query warps, key groups). A block
/// has query warps × key groups warps (at most 8: its `__launch_bounds__(256)`), and
/// [`attn_shared_bytes`] of dynamic shared memory for its key groups' tiles.
pub const ATTN_BLOCKS: &[(usize, usize)] =
    &[(4, 1), (2, 1), (1, 1), (4, 2), (2, 2), (2, 4), (1, 4)];
/// Dynamic shared memory of a fused attention block of `key_groups` key groups: a K and a V
/// tile each (64 keys × 72 elements of 2 bytes, the rows padded against bank conflicts).
pub const fn attn_shared_bytes(key_groups: usize) -> usize {
    key_groups * 2 * 64 * 72 * 2
}
/// Dynamic shared memory of the `qgemm_i8` / `qgemm_f8` kernels: 3 stages of 128 + 128 rows
/// of 144 bytes (a K tile of 128 bytes, padded). Above 48 KiB: set on the kernel at load, and
/// the own path is offered only where the device allows it per block.
pub const QGEMM_SHARED_BYTES: usize = 3 * (128 + 128) * 144;
/// Outputs a `qgemm_*` block computes along M and along N.
pub const QGEMM_TILE: usize = 128;
/// Rows of the output a `qgemm_i8_wg` block computes (one warpgroup's `wgmma.m64nNk32`).
pub const QGEMM_WG_ROWS: usize = 64;
/// Threads of a `qgemm_i8_wg` block: one warpgroup.
pub const QGEMM_WG_THREADS: u32 = 128;
/// Columns of the output a `qgemm_i8_wg` block computes. 64, not 128: half the accumulators, so
/// six blocks an SM instead of four to hide the epilogue's latency (session 33, resnet50 at
/// batch 64: faster on 37 of its 52 convolutions, by up to 26 %, among them every layer where
/// the kernel beat cuDNN; up to 9 % slower on the others).
pub const QGEMM_WG_COLS: usize = 64;
/// Dynamic shared memory of a `qgemm_i8_wg` launch of `cols` columns a block: 1,024 bytes to
/// align the first swizzle atom (wgmma's descriptors want 1,024), one stage a K tile (128 bytes
/// of 64 rows of xq and `cols` rows of w) up to two, the tile's scale and bias (up to 128 f32
/// each), and the residual's 64 rows of `cols` elements of `res_bytes` bytes (0: none), each
/// row padded by 8 elements so that the fragments' reads of 8 rows hit distinct banks.
pub const fn qgemm_wg_shared_bytes(k: usize, res_bytes: usize, cols: usize) -> usize {
    let stages = if k > 128 { 2 } else { 1 };
    1024 + stages * (QGEMM_WG_ROWS + cols) * 128 + 1024 + QGEMM_WG_ROWS * (cols + 8) * res_bytes
}
/// The most a `qgemm_i8_wg` launch asks for (set on the kernel at load).
pub const QGEMM_WG_SHARED_BYTES: usize = qgemm_wg_shared_bytes(usize::MAX, 2, QGEMM_WG_COLS);

/// The Hopper form of the int8 kernel (`qgemm_i8_wg`, compiled for sm_90a only: the module is
/// built for `sm_90a` on compute capability 9.0, `model::nvrtc::kernel_cubin`): the same
/// product and bytes as `qgemm_i8`, its sums by
/// `wgmma.mma_async` (A and B read from shared memory through descriptors) instead of
/// `mma.sync`, which on Hopper runs at a fraction of `wgmma`'s rate.
fn qgemm_wgmma_source() -> String {
    let list = |n: usize, f: &dyn Fn(usize) -> String| (0..n).map(f).collect::<Vec<_>>().join(", ");
    // wgmma's 32 accumulator registers of a 64 × 64 tile, named one by one.
    QGEMM_WG
        .replace("__WG_REGS__", &list(32, &|i| format!("%{i}")))
        .replace("__WG_OUTS__", &list(32, &|i| format!("\"+r\"(d[{i}])")))
}

const QGEMM_WG: &str = r#"
// qgemm_i8 on Hopper's wgmma (sm_90a). Block: one warpgroup (128 threads), 64 x BN outputs by
// wgmma.m64nBNk32 (s8 x s8 -> exact s32, the same sums as the other paths), BN = 64 (with 128,
// four blocks an SM where 64 fits six: slower on most layers). K in tiles of 128 bytes by
// cp.async into 128-byte swizzle atoms (8 rows x 128 bytes; the 16-byte chunk c of row r at c ^ (r % 8)), the layout
// the K-major descriptors name (swizzle mode 1, 1,024 bytes between 8-row groups); a tile's
// four k-steps of 32 bytes advance the descriptors' start by 32 bytes. Two stages where K has
// more than one tile, else one. Each thread's cp.async writes are made visible to wgmma (the
// async proxy) by fence.proxy.async before the block barrier.
// Session 32's form (two warpgroups, 128 x 128, its int32 sums through 64 KiB of shared memory
// to qgemm_epilogue) was latency-bound in its epilogue (ncu: 25 % occupancy, ~40 instructions
// an output, an IEEE division among them). This one:
// - fetches the residual's tile with the first K tile, so that it is in flight with the sums;
// - computes the epilogue on the accumulator fragments in registers; only bytes go through
//   shared memory, for 8-byte stores;
// - makes a byte by a multiply with 1 / ys, dividing only near a tie (wg_bytes2: the same byte);
// - pads the rows it reads or writes 8 at once (BN + 8), so that they hit distinct banks;
// - compiles a path for int8 bytes out with a residual of bytes or none (BYTES).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ unsigned long long wg_desc(unsigned addr) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}
template <int BN>
__device__ __forceinline__ void wg_mma(int* d, unsigned long long da, unsigned long long db) {
    static_assert(BN == 64, "wgmma is written out for n64");
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 {__WG_REGS__}, %32, %33, 1;"
                 : __WG_OUTS__
                 : "l"(da), "l"(db));
}
__device__ __forceinline__ void cp_async8(unsigned dst, const void* src, int bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" :: "r"(dst), "l"(src), "r"(bytes) : "memory");
}
// One K tile from k0: 64 rows of xq at sa, BN rows of w after them; rows past M or N and
// chunks past K are zeros. Always one cp.async group (empty past the last tile). A thread
// copies chunk t % 8 of rows t / 8 + 16h: its chunk, its swizzled offset and its rows' first
// addresses are worked out once, and each further row is a step (the index arithmetic per
// copy, 64-bit and signed, had cost as many instructions as the epilogue).
template <int BN>
__device__ __forceinline__ void qgemm_wg_stage(const signed char* __restrict__ xq, const signed char* __restrict__ w,
                                               unsigned sa, int m0, int n0, int k0, int m, int n, int k, bool any) {
    if (any) {
        unsigned t = threadIdx.x, c = t & 7u, r = t >> 3;
        unsigned off = r * 128u + ((c ^ (r & 7u)) << 4);
        int kc = k0 + (int)c * 16;
        bool kin = kc < k;
        long long step = 16LL * k;
        const signed char* a = xq + (long long)(m0 + (int)r) * k + kc;
        const signed char* b = w + (long long)(n0 + (int)r) * k + kc;
        unsigned sb = sa + 64 * 128;
#pragma unroll
        for (int h = 0; h < 4; ++h) {
            bool in = kin && m0 + (int)r + 16 * h < m;
            cp_async16(sa + off + h * 2048, in ? (const void*)(a + h * step) : (const void*)xq, in ? 16 : 0);
        }
#pragma unroll
        for (int h = 0; h < BN / 16; ++h) {
            bool in = kin && n0 + (int)r + 16 * h < n;
            cp_async16(sb + off + h * 2048, in ? (const void*)(b + h * step) : (const void*)w, in ? 16 : 0);
        }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
}
// The residual's 64 x BN tile into rsm, rows of BN + 8 elements of EB bytes (1: bytes, 2: T), 8
// columns a copy (n and the tile's columns are multiples of 8, so a copy is whole and aligned).
// The fragments read 8 rows at once, and rows of BN would put them in one bank. A thread copies
// the same 8 columns of rows t / (BN / 8) + (1024 / BN)h, its first address worked out once.
template <int BN, int EB>
__device__ __forceinline__ void qgemm_wg_residual(const void* res, unsigned rsm, int m0, int n0, int m, int n) {
    const int LD = BN + 8, RUNS = BN / 8, ROWS = 128 / RUNS;
    unsigned t = threadIdx.x, r = t / RUNS, c = (t % RUNS) * 8;
    const unsigned char* src = (const unsigned char*)res + ((long long)(m0 + (int)r) * n + n0 + (int)c) * EB;
    long long step = (long long)ROWS * n * EB;
    unsigned dst = rsm + (r * LD + c) * EB;
    bool cin = n0 + (int)c < n;
#pragma unroll
    for (int h = 0; h < BN / 16; ++h) {
        bool in = cin && m0 + (int)r + ROWS * h < m;
        const void* s = in ? (const void*)(src + h * step) : res;
        if (EB == 1) cp_async8(dst + h * ROWS * LD, s, in ? 8 : 0);
        else cp_async16(dst + h * ROWS * LD * 2, s, in ? 16 : 0);
    }
}
// epi_byte<1>'s bytes of v0, v1 (each stored in T, divided by ys, rounded, saturated) by a
// multiply with inv = 1 / ys, packed little-endian. A product is within 2^-23 of the quotient
// relatively, so within 2^-15 where |q| < 256 (beyond, both saturate alike): its rounding can
// differ from the quotient's only within 2^-14 of a half, where the division decides. The
// division is out of line: inlined at each of a thread's pairs, its code made the kernel's
// larger than the instruction cache.
__device__ __forceinline__ unsigned wg_sat8(float q) {
    return q != q ? 0u : (unsigned)(int)fminf(fmaxf(q, -128.f), 127.f) & 255u;
}
__device__ __noinline__ unsigned wg_divided_bytes2(float x0, float x1, float ys) {
    return wg_sat8(rintf(__fdiv_rn(x0, ys))) | (wg_sat8(rintf(__fdiv_rn(x1, ys))) << 8);
}
// a rounded to the nearest even and saturated to int8 in one instruction (NaN gives 0, as
// wg_sat8), in the low byte.
__device__ __forceinline__ unsigned wg_s8(float a) {
    unsigned r;
    asm("cvt.rni.sat.s8.f32 %0, %1;" : "=r"(r) : "f"(a));
    return r;
}
__device__ __forceinline__ unsigned wg_bytes2(float v0, float v1, float ys, float inv) {
    float x0, x1;
    u2f2(f2u2(v0, v1), x0, x1);
    float a0 = __fmul_rn(x0, inv), a1 = __fmul_rn(x1, inv);
    if (fmaxf(fabsf(a0 - rintf(a0)), fabsf(a1 - rintf(a1))) > 0.5f - 0x1p-14f) return wg_divided_bytes2(x0, x1, ys);
    return __byte_perm(wg_s8(a0), wg_s8(a1), 0x0040) & 0xffffu;
}
// The epilogue's pair (j, h) of this thread (columns 8j + 2(lane % 4) (+ 1), rows 8h on) on
// the bytes path: its two values as stored in T (what the FakeQuant step would have read).
template <int ACT>
__device__ __forceinline__ void wg_pair_stored(const int* d, int j, int h, const float* svp, const unsigned char* rb, int ld,
                                               bool has_r, float rs, int ak, float p0, float p1, float& x0, float& x1) {
    float2 sc = *(const float2*)(svp + 8 * j), bi = *(const float2*)(svp + 128 + 8 * j);
    float r0v = 0.f, r1v = 0.f;
    if (has_r) {
        unsigned short b2 = *(const unsigned short*)(rb + 8 * h * ld + 8 * j);
        r0v = __fmul_rn((float)(signed char)(b2 & 255), rs);
        r1v = __fmul_rn((float)(signed char)(b2 >> 8), rs);
    }
    float v0 = epi_math<ACT>((float)d[4 * j + 2 * h], sc.x, bi.x, has_r, r0v, ak, p0, p1);
    float v1 = epi_math<ACT>((float)d[4 * j + 2 * h + 1], sc.y, bi.y, has_r, r1v, ak, p0, p1);
    u2f2(f2u2(v0, v1), x0, x1);
}
// The bytes path's epilogue: every pair's bytes by the multiply (wg_bytes2's fast case) in one
// block of straight-line code, the pairs near a tie noted in a mask and their bytes made again
// by the division after it. With a branch (and a call) at each pair, as wg_bytes2 has, each
// pair was its own short dependent chain: ncu (session 33) found the kernel issuing in 58 % of
// cycles, mostly waiting on fixed-latency dependencies. A tie is rare (within 2^-14 of a half:
// ~1e-4 of the bytes), so the redo costs little. Columns past N compute zeros (their scale,
// bias, sums and residual are 0) that the copy-out skips.
template <int BN, int ACT>
__device__ __forceinline__ void wg_bytes_epilogue(const int* d, const float* svp, const unsigned char* rb, unsigned char* yb,
                                                  int ld, bool has_r, float rs, int ak, float p0, float p1, float ys, float inv) {
    unsigned ties = 0;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float x0, x1;
            wg_pair_stored<ACT>(d, j, h, svp, rb, ld, has_r, rs, ak, p0, p1, x0, x1);
            float a0 = __fmul_rn(x0, inv), a1 = __fmul_rn(x1, inv);
            bool near = fmaxf(fabsf(a0 - rintf(a0)), fabsf(a1 - rintf(a1))) > 0.5f - 0x1p-14f;
            ties |= (unsigned)near << (2 * j + h);
            *(unsigned short*)(yb + 8 * h * ld + 8 * j) = (unsigned short)(__byte_perm(wg_s8(a0), wg_s8(a1), 0x0040) & 0xffffu);
        }
    }
    if (ties == 0) return;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            if (!((ties >> (2 * j + h)) & 1u)) continue;
            float x0, x1;
            wg_pair_stored<ACT>(d, j, h, svp, rb, ld, has_r, rs, ak, p0, p1, x0, x1);
            *(unsigned short*)(yb + 8 * h * ld + 8 * j) = (unsigned short)wg_divided_bytes2(x0, x1, ys);
        }
    }
}
// BYTES: y int8 bytes, no copy, a residual of bytes or none (every resnet50 layer): compiled
// without the other cases' branches, which cost as many instructions as the arithmetic.
template <int BN, int ACT, bool BYTES>
__device__ __forceinline__ void qgemm_wg_body(const signed char* __restrict__ xq, const signed char* __restrict__ w,
                                              void* y, const float* __restrict__ scale, const T* __restrict__ bias,
                                              const T* res, signed char* ycopy, int m, int n, int k, int ak,
                                              float p0, float p1, float ys, int yq, float cs, float rs) {
    const int LD = BN + 8, RUNS = BN / 8, STAGE = (64 + BN) * 128;
    extern __shared__ __align__(16) signed char qsm[];
    unsigned raw = (unsigned)__cvta_generic_to_shared(qsm);
    unsigned base = (raw + 1023u) & ~1023u;
    int ntiles = (n + BN - 1) / BN;
    int m0 = (int)(blockIdx.x / ntiles) * 64, n0 = (int)(blockIdx.x % ntiles) * BN;
    int ktiles = (k + 127) / 128, stages = ktiles > 1 ? 2 : 1;
    unsigned ssm = base + stages * STAGE, rsm = ssm + 1024;
    float* sv = (float*)(qsm + (ssm - raw));
    int eb = rs != 0.f ? 1 : 2;
    // The residual's tile in the first K tile's group, then the tile's scale and bias (visible
    // after the first barrier), their loads in flight with the copies.
    if (res && (BYTES || eb == 1)) qgemm_wg_residual<BN, 1>(res, rsm, m0, n0, m, n);
    else if (res) qgemm_wg_residual<BN, 2>(res, rsm, m0, n0, m, n);
    qgemm_wg_stage<BN>(xq, w, base, m0, n0, 0, m, n, k, true);
    if (threadIdx.x < BN) {
        int c = n0 + threadIdx.x;
        sv[threadIdx.x] = c < n ? scale[c] : 0.f;
        sv[128 + threadIdx.x] = bias && c < n ? ld(bias, c) : 0.f;
    }
    int d[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) d[i] = 0;
    for (int kt = 0; kt < ktiles; ++kt) {
        // The next tile into the other stage (its last reader, tile kt - 1, is done: the barrier
        // at the end of the last iteration), then wait for tile kt.
        int next = kt + 1;
        qgemm_wg_stage<BN>(xq, w, base + (next & 1) * STAGE, m0, n0, next * 128, m, n, k, stages > 1 && next < ktiles);
        asm volatile("cp.async.wait_group 1;" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads();
        unsigned a = base + (stages > 1 ? (kt & 1) : 0) * STAGE, b = a + 64 * 128;
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) wg_mma<BN>(d, wg_desc(a + kk * 32), wg_desc(b + kk * 32));
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
        __syncthreads();
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    // The epilogue on the fragments: warp w holds rows 16w + lane / 4 (+ 8), columns
    // 8j + 2(lane % 4) (+ 1) in d[4j .. 4j + 3]. y's and the copy's bytes go to the first stage
    // (free now), 64 rows of LD each; a y of T is stored from here, two values a store.
    // Columns past N are skipped (a uniform branch), or on the bytes path made and not copied.
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
    // This thread's first pair in each tile of shared memory; a pair (j, h) is 8j columns and
    // 8h rows on from it.
    int r0 = 16 * warp + g, c0 = 2 * t4;
    unsigned char* ytile = (unsigned char*)(qsm + (base - raw));
    unsigned char* ctile = ytile + 64 * LD;
    unsigned char* yb = ytile + r0 * LD + c0;
    unsigned char* cb = ctile + r0 * LD + c0;
    const unsigned char* rb = (const unsigned char*)(qsm + (rsm - raw)) + (r0 * LD + c0) * eb;
    const float* svp = sv + c0;
    T* yt = (T*)y + (long long)(m0 + r0) * n + n0 + c0;
    // The correctly rounded reciprocals (1.f / ys's bits, without the division's code).
    float yinv = __frcp_rn(ys), cinv = __frcp_rn(cs);
    bool has_r = res != nullptr;
    if (BYTES) {
        wg_bytes_epilogue<BN, ACT>(d, svp, rb, yb, LD, has_r, rs, ak, p0, p1, ys, yinv);
    } else {
#pragma unroll
        for (int j = 0; j < RUNS; ++j) {
            if (8 * j >= n - n0) break;
            float2 sc = *(const float2*)(svp + 8 * j), bi = *(const float2*)(svp + 128 + 8 * j);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                int at = 8 * h * LD + 8 * j;
                float r0v = 0.f, r1v = 0.f;
                if (has_r) {
                    if (eb == 1) {
                        unsigned short b2 = *(const unsigned short*)(rb + at);
                        r0v = __fmul_rn((float)(signed char)(b2 & 255), rs);
                        r1v = __fmul_rn((float)(signed char)(b2 >> 8), rs);
                    } else {
                        u2f2(*(const unsigned*)(rb + 2 * at), r0v, r1v);
                    }
                }
                float v0 = epi_math<ACT>((float)d[4 * j + 2 * h], sc.x, bi.x, has_r, r0v, ak, p0, p1);
                float v1 = epi_math<ACT>((float)d[4 * j + 2 * h + 1], sc.y, bi.y, has_r, r1v, ak, p0, p1);
                if (yq == 0) {
                    if (m0 + r0 + 8 * h < m && n0 + c0 + 8 * j < n) *(unsigned*)(yt + (long long)8 * h * n + 8 * j) = f2u2(v0, v1);
                } else {
                    *(unsigned short*)(yb + at) = (unsigned short)wg_bytes2(v0, v1, ys, yinv);
                }
                if (ycopy) *(unsigned short*)(cb + at) = (unsigned short)wg_bytes2(v0, v1, cs, cinv);
            }
        }
    }
    if (!BYTES && yq == 0 && !ycopy) return;
    __syncthreads();
#pragma unroll
    for (int h = 0; h < BN / 16; ++h) {
        int chunk = threadIdx.x + h * 128, r = chunk / RUNS, c = (chunk % RUNS) * 8;
        if (m0 + r >= m || n0 + c >= n) continue;
        long long at = (long long)(m0 + r) * n + n0 + c;
        if (BYTES || yq != 0) *(uint2*)((unsigned char*)y + at) = *(const uint2*)(ytile + r * LD + c);
        if (!BYTES && ycopy) *(uint2*)((unsigned char*)ycopy + at) = *(const uint2*)(ctile + r * LD + c);
    }
}
template <int BN>
__device__ __forceinline__ void qgemm_wg_entry(const signed char* __restrict__ xq, const signed char* __restrict__ w,
        void* y, const float* __restrict__ scale, const T* __restrict__ bias, const T* res, signed char* ycopy,
        int m, int n, int k, int ak, float p0, float p1, float ys, int yq, float cs, float rs) {
    bool bytes = yq == 1 && !ycopy && (!res || rs != 0.f);
    if (ak == 1 && bytes) qgemm_wg_body<BN, 1, true>(xq, w, y, scale, bias, res, ycopy, m, n, k, ak, p0, p1, ys, yq, cs, rs);
    else if (ak == 0 && bytes) qgemm_wg_body<BN, 0, true>(xq, w, y, scale, bias, res, ycopy, m, n, k, ak, p0, p1, ys, yq, cs, rs);
    else if (ak == 0) qgemm_wg_body<BN, 0, false>(xq, w, y, scale, bias, res, ycopy, m, n, k, ak, p0, p1, ys, yq, cs, rs);
    else if (ak == 1) qgemm_wg_body<BN, 1, false>(xq, w, y, scale, bias, res, ycopy, m, n, k, ak, p0, p1, ys, yq, cs, rs);
    else qgemm_wg_body<BN, -1, false>(xq, w, y, scale, bias, res, ycopy, m, n, k, ak, p0, p1, ys, yq, cs, rs);
}
#endif
// Never launched off sm_90a: the build offers it on compute capability 9.0 (its module built
// for sm_90a).
extern "C" __global__ void __launch_bounds__(128, 6) qgemm_i8_wg(const signed char* __restrict__ xq, const signed char* __restrict__ w,
        void* y, const float* __restrict__ scale, const T* __restrict__ bias, const T* res, signed char* ycopy,
        int m, int n, int k, int ak, float p0, float p1, float ys, int yq, float cs, float rs) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    qgemm_wg_entry<64>(xq, w, y, scale, bias, res, ycopy, m, n, k, ak, p0, p1, ys, yq, cs, rs);
#else
    __trap();
#endif
}
"#;
/// A direct tensor-core convolution for inputs of few channels (a CNN's stem: 3 channels,
/// 7×7 stride 2 in resnets), a candidate of the convolution search (`model/conv.rs`):
/// cuDNN pads such an input to 4 or 8 channels in two extra kernels and runs its first-layer
/// kernel at a small share of the tensor cores (resnet50 batch 64: 123 µs + 29 µs of padding
/// under ncu, session 36).
const STEM: &str = r#"
// conv_stem_n{64,128}: y = act(conv(x, w) + bias), NHWC, one group, C <= 4 input channels, M
// <= 64 (128) output channels in runs of 16 (ldmatrix takes two n8 tiles). A block: 4 warps, each one output row of 16
// pixels (an m16 tile) of a 4 x 16 tile, all M channels, K = kh * kw * C (padded to kp, a
// multiple of 16) in k16 steps of mma.sync m16n8k16 (f32 sums). The block keeps the weights
// in shared memory ([M][kp + 8], padded so that ldmatrix's 8 rows hit distinct banks) and loops
// over tiles; a tile's input patch (the rows and columns its 64 outputs read, zeros outside
// the image) comes to shared memory whole, and the A fragments are gathered from it through a
// table of each k's offset from an output's first input (kofs). A k past K reads that first
// input, a value of the patch (whatever it is, its weight is 0: an offset past the patch would
// be past the shared memory for the later rows).
struct StemP { int n, h, w, c, oh, ow, m, kh, kw, sh, sw, ph, pw, dh, dw, kp, act, tiles_x, tiles_y, cinv; float p0, p1; };
#define STEM_TR 4
#define STEM_TC 16
#define STEM_LOADS 8
template <int NT>
__device__ __forceinline__ void conv_stem_body(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                                               T* __restrict__ y, const StemP& p) {
    extern __shared__ __align__(16) unsigned char stem_smem[];
    int ldw = p.kp + 8, K = p.kh * p.kw * p.c;
    T* ws = (T*)stem_smem;
    int* kofs = (int*)(ws + p.m * ldw);
    T* patch = (T*)(kofs + p.kp);
    int PH = (STEM_TR - 1) * p.sh + (p.kh - 1) * p.dh + 1;
    int PWC = ((STEM_TC - 1) * p.sw + (p.kw - 1) * p.dw + 1) * p.c;
    int psize = PH * PWC;
    // Loads are issued STEM_LOADS at a time before their stores: a loop of load-then-store
    // waits out each load's latency in turn (session 36's first form: 0.35 ms for resnet50's
    // stem at batch 64, cuDNN 0.15).
    for (int i0 = threadIdx.x; i0 < p.m * p.kp; i0 += STEM_LOADS * 128) {
        T v[STEM_LOADS];
#pragma unroll
        for (int u = 0; u < STEM_LOADS; ++u) {
            int i = i0 + u * 128, r = i / p.kp, k = i - r * p.kp;
            v[u] = i < p.m * p.kp && k < K ? w[(long long)r * K + k] : (T)0;
        }
#pragma unroll
        for (int u = 0; u < STEM_LOADS; ++u) {
            int i = i0 + u * 128, r = i / p.kp, k = i - r * p.kp;
            if (i < p.m * p.kp) ws[r * ldw + k] = v[u];
        }
    }
    for (int k = threadIdx.x; k < p.kp; k += blockDim.x) {
        int c = k % p.c, t = k / p.c, kx = t % p.kw, ky = t / p.kw;
        kofs[k] = k < K ? ky * p.dh * PWC + kx * p.dw * p.c + c : 0;
    }
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    // This lane's ldmatrix row: weights row n0 + 8 (mat / 2) + lane % 8, columns k0 + 8 (mat % 2).
    int mat = lane >> 3;
    unsigned wsa = (unsigned)__cvta_generic_to_shared(ws) + (((mat >> 1) * 8 + (lane & 7)) * ldw + (mat & 1) * 8) * 2;
    int ntiles = p.n * p.tiles_y * p.tiles_x;
    for (int tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
        int tx = tile % p.tiles_x, rest = tile / p.tiles_x, ty = rest % p.tiles_y, img = rest / p.tiles_y;
        int oy0 = ty * STEM_TR, ox0 = tx * STEM_TC;
        int iy0 = oy0 * p.sh - p.ph, ixc0 = (ox0 * p.sw - p.pw) * p.c;
        const T* xi = x + (long long)img * p.h * p.w * p.c;
        // The last tile's gathers are done (and, the first time, the weights and table are in).
        __syncthreads();
        for (int i0 = threadIdx.x; i0 < psize; i0 += STEM_LOADS * 128) {
            T v[STEM_LOADS];
#pragma unroll
            for (int u = 0; u < STEM_LOADS; ++u) {
                int i = i0 + u * 128, py = i / PWC, q = ixc0 + i - py * PWC, iy = iy0 + py;
                // q / c by a multiply (c <= 4, q < 2^15: exact).
                bool in = i < psize && iy >= 0 && iy < p.h && q >= 0 && ((q * p.cinv) >> 16) < p.w;
                v[u] = in ? xi[(long long)iy * p.w * p.c + q] : (T)0;
            }
#pragma unroll
            for (int u = 0; u < STEM_LOADS; ++u)
                if (i0 + u * 128 < psize) patch[i0 + u * 128] = v[u];
        }
        __syncthreads();
        // Rows g and g + 8 of this warp's A: output pixels ox0 + g and ox0 + g + 8 of row oy0 + warp.
        int b0 = warp * p.sh * PWC + g * p.sw * p.c, b1 = b0 + 8 * p.sw * p.c;
        float acc[NT][4];
#pragma unroll
        for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
        for (int k0 = 0; k0 < p.kp; k0 += 16) {
            int2 o01 = *(const int2*)(kofs + k0 + 2 * t), o23 = *(const int2*)(kofs + k0 + 2 * t + 8);
            unsigned a[4];
            a[0] = (unsigned)patch[b0 + o01.x] | ((unsigned)patch[b0 + o01.y] << 16);
            a[1] = (unsigned)patch[b1 + o01.x] | ((unsigned)patch[b1 + o01.y] << 16);
            a[2] = (unsigned)patch[b0 + o23.x] | ((unsigned)patch[b0 + o23.y] << 16);
            a[3] = (unsigned)patch[b1 + o23.x] | ((unsigned)patch[b1 + o23.y] << 16);
#pragma unroll
            for (int j = 0; j < NT; j += 2) {
                if (j * 8 >= p.m) break;
                unsigned b[4];
                ldsm4(wsa + (j * 8 * ldw + k0) * 2, b);
                mma16816(acc[j], a, b[0], b[1]);
                if ((j + 1) * 8 < p.m) mma16816(acc[j + 1], a, b[2], b[3]);
            }
        }
        int oy = oy0 + warp;
        if (oy >= p.oh) continue;
        T* yr = y + ((long long)img * p.oh + oy) * p.ow * p.m;
        int ox_a = ox0 + g, ox_b = ox_a + 8;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            if (j * 8 >= p.m) break;
            int n = j * 8 + 2 * t;
            float bi0 = 0.f, bi1 = 0.f;
            if (bias) { bi0 = ld(bias, n); bi1 = ld(bias, n + 1); }
            if (ox_a < p.ow)
                *(unsigned*)(yr + (long long)ox_a * p.m + n) =
                    f2u2(act(acc[j][0] + bi0, p.act, p.p0, p.p1), act(acc[j][1] + bi1, p.act, p.p0, p.p1));
            if (ox_b < p.ow)
                *(unsigned*)(yr + (long long)ox_b * p.m + n) =
                    f2u2(act(acc[j][2] + bi0, p.act, p.p0, p.p1), act(acc[j][3] + bi1, p.act, p.p0, p.p1));
        }
    }
}
extern "C" __global__ void __launch_bounds__(128) conv_stem_n64(const T* __restrict__ x, const T* __restrict__ w,
                                                                const T* __restrict__ bias, T* __restrict__ y, StemP p) {
#if __CUDA_ARCH__ >= 800
    conv_stem_body<8>(x, w, bias, y, p);
#endif
}
extern "C" __global__ void __launch_bounds__(128) conv_stem_n128(const T* __restrict__ x, const T* __restrict__ w,
                                                                 const T* __restrict__ bias, T* __restrict__ y, StemP p) {
#if __CUDA_ARCH__ >= 800
    conv_stem_body<16>(x, w, bias, y, p);
#endif
}
"#;
/// The most dynamic shared memory any [`ATTN_BLOCKS`] shape asks for (set on the kernel at
/// load: above 48 KiB a kernel must opt in).
pub const ATTN_MAX_SHARED_BYTES: usize = attn_shared_bytes(4);
/// Elements per lane of the one-warp-per-row LayerNorm and softmax kernels (`layernorm_warpN`,
/// `softmax_warpN` take rows of at most 32·N): the smallest that fits keeps registers low.
pub const WARP_ROW_PER_LANE: &[usize] = &[4, 8, 16, 32];

const COMMON: &str = r#"
#define MAX_RANK __MAX_RANK__
struct Space { int rank; long long dims[MAX_RANK]; long long s0[MAX_RANK]; long long s1[MAX_RANK]; long long s2[MAX_RANK]; };

__device__ __forceinline__ float act(float x, int k, float p0, float p1) {
    switch (k) {
    case 0: return x;
    case 1: return fmaxf(x, 0.f);
    case 2: return fminf(fmaxf(x, 0.f), 6.f);
    case 3: return fminf(fmaxf(x, p0), p1);
    case 4: return x >= 0.f ? x : p0 * x;
    case 5: return 1.f / (1.f + expf(-x));
    case 6: return fminf(fmaxf(p0 * x + p1, 0.f), 1.f);
    case 7: return x * fminf(fmaxf(x + 3.f, 0.f), 6.f) * (1.f / 6.f);
    case 8: return x / (1.f + expf(-x));
    case 9: return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
    case 10: return 0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    case 11: return tanhf(x);
    case 12: return expf(x);
    case 13: return logf(x);
    case 14: return sqrtf(x);
    case 15: return erff(x);
    case 16: return -x;
    case 17: return fabsf(x);
    case 18: return 1.f / x;
    }
    return x;
}

__device__ __forceinline__ float binop(float a, float b, int op) {
    switch (op) {
    case 0: return a + b;
    case 1: return a - b;
    case 2: return a * b;
    case 3: return a / b;
    case 4: return powf(a, b);
    case 5: return fmaxf(a, b);
    case 6: return fminf(a, b);
    }
    return a;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Block-wide reduction (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
__device__ float block_sum(float v, float* sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.f;
    return warp_sum(v);
}
__device__ float block_max(float v, float* sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : -3.402823466e38f;
    return warp_max(v);
}

#define GRID_STRIDE(i, n) for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (long long)gridDim.x * blockDim.x)

extern "C" __global__ void cast_in(const float* __restrict__ x, T* __restrict__ y, long long n) {
    GRID_STRIDE(i, n) st(y, i, x[i]);
}
// v rounded half to even onto float8 e4m3fn's grid (isolane_engine::quant::round_e4m3fn):
// ±448 past it when saturating, else NaN; NaN stays NaN.
__device__ __forceinline__ float round_e4m3fn(float v, int saturate) {
    if (v != v) return v;
    float a = fabsf(v);
    if (a > 3.402823466e38f) return saturate ? copysignf(448.f, v) : __int_as_float(0x7fc00000);
    int e = a >= 1.17549435e-38f ? (__float_as_int(a) >> 23) - 127 : -6;
    if (e < -6) e = -6;
    float q = __int_as_float((e - 3 + 127) << 23);  // the grid's spacing: a power of two
    float r = rintf(__fdiv_rn(a, q)) * q;
    if (r > 448.f) r = saturate ? 448.f : __int_as_float(0x7fc00000);
    return copysignf(r, v);
}

// DequantizeLinear(QuantizeLinear(x)) of one value (ONNX; isolane_engine::quant), in f32: an
// IEEE division, rounding half to even, saturation to [lo, hi] (integers) or float8 e4m3fn,
// then (q - z) * s.
__device__ __forceinline__ float fake_quant_one(float x, float s, float z, float lo, float hi, int fp8, int saturate) {
    float v = __fdiv_rn(x, s);
    float q;
    if (fp8) q = round_e4m3fn(v, saturate);
    else if (v != v) q = v;
    else q = fminf(fmaxf(rintf(v) + z, lo), hi);
    return __fmul_rn(q - z, s);
}

// cast_in writing channels last: pixel p of item b (p < hw) takes x[(b·c + ch)·hw + p] for
// each channel ch into y[(b·hw + p)·cp + ch], then zeros for channels c .. cp - 1 (an RGB
// stem stored as 4 channels). With q.fq set, each value is first fake-quantized per tensor
// (a quantized model's FakeQuant of its input, which then has no pass of its own; from the
// f32 value, as the CPU reference does). 32-bit indices when the size allows it.
struct CastQ { int fq, fp8, saturate; float s, z, lo, hi; };
__device__ __forceinline__ float cast_in_value(float v, const CastQ& q) {
    return q.fq ? fake_quant_one(v, q.s, q.z, q.lo, q.hi, q.fp8, q.saturate) : v;
}
template <typename I>
__device__ __forceinline__ void cast_in_nhwc_body(const float* __restrict__ x, T* __restrict__ y, I pixels, int c, int cp, I hw,
                                                  const CastQ& q) {
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < pixels; i += (I)gridDim.x * blockDim.x) {
        I b = i / hw, p = i - b * hw;
        const float* xp = x + b * c * hw + p;
        // Two values a store where the row's width is even (an RGB stem stored as 4: 8 bytes
        // a pixel at fp16 in two stores, not four).
        for (int ch = 0; ch < cp; ch += 2) {
            float v0 = ch < c ? cast_in_value(xp[ch * hw], q) : 0.f;
            if (ch + 1 >= cp) {
                st(y, i * cp + ch, v0);
                break;
            }
            float v1 = ch + 1 < c ? cast_in_value(xp[(ch + 1) * hw], q) : 0.f;
            if ((cp & 1) == 0) {
                st2(y, i * cp + ch, v0, v1);
            } else {
                st(y, i * cp + ch, v0);
                st(y, i * cp + ch + 1, v1);
            }
        }
    }
}
extern "C" __global__ void cast_in_nhwc(const float* __restrict__ x, T* __restrict__ y, long long pixels, int c, int cp,
                                        long long hw, CastQ q) {
    if (pixels * cp < 2147483647LL) cast_in_nhwc_body<int>(x, y, (int)pixels, c, cp, (int)hw, q);
    else cast_in_nhwc_body<long long>(x, y, pixels, c, cp, hw, q);
}
extern "C" __global__ void cast_out(const T* __restrict__ x, float* __restrict__ y, long long n) {
    GRID_STRIDE(i, n) y[i] = ld(x, i);
}

// y = act(x * scale[ch] + bias[ch] + res), ch = (i / inner) % channels; scale, bias and res
// may be null. 32-bit index arithmetic when the sizes allow it (64-bit division is slow).
template <typename I>
__device__ __forceinline__ void pointwise_body(const T* x, T* y, const T* __restrict__ scale, const T* __restrict__ bias,
                                               const T* res, I n, I channels, I inner, int k, float p0, float p1) {
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
        float v = ld(x, i);
        if (scale || bias) {
            I ch = (i / inner) % channels;
            if (scale) v *= ld(scale, ch);
            if (bias) v += ld(bias, ch);
        }
        if (res) v += ld(res, i);
        st(y, i, act(v, k, p0, p1));
    }
}
extern "C" __global__ void pointwise(const T* x, T* y, const T* __restrict__ scale, const T* __restrict__ bias,
                                     const T* res, long long n, long long channels, long long inner,
                                     int k, float p0, float p1) {
    if (n < 2147483647LL) pointwise_body<int>(x, y, scale, bias, res, (int)n, (int)channels, (int)inner, k, p0, p1);
    else pointwise_body<long long>(x, y, scale, bias, res, n, channels, inner, k, p0, p1);
}

// The pointwise pass over channels-contiguous values (NHWC, or a row-major last axis):
// VW elements per thread, each operand one 16-byte access. nv = n / VW, cv = channels / VW;
// n and channels are multiples of VW and every pointer is 16-byte aligned (the Rust side
// checks). x and y may be the same buffer.
extern "C" __global__ void pointwise_v(const T* x, T* y, const T* __restrict__ scale, const T* __restrict__ bias,
                                       const T* res, int nv, int cv, int k, float p0, float p1) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < nv; i += gridDim.x * blockDim.x) {
        long long e = (long long)i * VW;
        float v[VW], o[VW];
        ldv(x, e, v);
        int ch = (i % cv) * VW;
        if (scale) {
            ldv(scale, ch, o);
#pragma unroll
            for (int j = 0; j < VW; ++j) v[j] *= o[j];
        }
        if (bias) {
            ldv(bias, ch, o);
#pragma unroll
            for (int j = 0; j < VW; ++j) v[j] += o[j];
        }
        if (res) {
            ldv(res, e, o);
#pragma unroll
            for (int j = 0; j < VW; ++j) v[j] += o[j];
        }
#pragma unroll
        for (int j = 0; j < VW; ++j) v[j] = act(v[j], k, p0, p1);
        stv(y, e, v);
    }
}

// Operand 0 = y (written), 1 = a, 2 = b. The index is split into coordinates with 32-bit
// division when n fits (offsets stay 64-bit).
template <typename I>
__device__ __forceinline__ void binary_body(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y,
                                            I n, int op, const Space& s) {
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
        I r = i;
        long long oy = 0, oa = 0, ob = 0;
        for (int d = s.rank - 1; d >= 0; --d) {
            I dim = (I)s.dims[d];
            I q = r % dim;
            r /= dim;
            oy += q * s.s0[d]; oa += q * s.s1[d]; ob += q * s.s2[d];
        }
        st(y, oy, binop(ld(a, oa), ld(b, ob), op));
    }
}
extern "C" __global__ void binary(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y,
                                  long long n, int op, Space s) {
    if (n < 2147483647LL) binary_body<int>(a, b, y, (int)n, op, s);
    else binary_body<long long>(a, b, y, n, op, s);
}

// Operand 0 = y, 1 = x; E is the element (the dtype, or 4/8/16 bytes of it: the Rust side
// rescales the space so that the innermost run is copied in wide words).
template <typename E, typename I>
__device__ __forceinline__ void copy_body(const E* __restrict__ x, E* __restrict__ y, I n, const Space& s) {
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
        I r = i;
        long long oy = 0, ox = 0;
        for (int d = s.rank - 1; d >= 0; --d) {
            I dim = (I)s.dims[d];
            I q = r % dim;
            r /= dim;
            oy += q * s.s0[d]; ox += q * s.s1[d];
        }
        y[oy] = x[ox];
    }
}

// One block per row; mean and variance in two passes over the row (it stays in L1/L2).
extern "C" __global__ void layernorm(const T* __restrict__ x, T* __restrict__ y, const T* __restrict__ g,
                                     const T* __restrict__ b, long long cols, float eps) {
    __shared__ float sh[32];
    const T* xr = x + blockIdx.x * cols;
    T* yr = y + blockIdx.x * cols;
    float s = 0.f;
    for (long long c = threadIdx.x; c < cols; c += blockDim.x) s += ld(xr, c);
    float mean = block_sum(s, sh) / (float)cols;
    float v = 0.f;
    for (long long c = threadIdx.x; c < cols; c += blockDim.x) { float d = ld(xr, c) - mean; v += d * d; }
    float rstd = rsqrtf(block_sum(v, sh) / (float)cols + eps);
    for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
        float o = (ld(xr, c) - mean) * rstd * ld(g, c);
        if (b) o += ld(b, c);
        st(yr, c, o);
    }
}

// One block per (outer, inner) row of `len` elements with stride `inner`.
extern "C" __global__ void softmax(const T* __restrict__ x, T* __restrict__ y, long long len, long long inner) {
    __shared__ float sh[32];
    long long o = blockIdx.x / inner, in = blockIdx.x % inner;
    const T* xr = x + o * len * inner + in;
    T* yr = y + o * len * inner + in;
    float m = -3.402823466e38f;
    for (long long c = threadIdx.x; c < len; c += blockDim.x) m = fmaxf(m, ld(xr, c * inner));
    m = block_max(m, sh);
    float s = 0.f;
    for (long long c = threadIdx.x; c < len; c += blockDim.x) s += expf(ld(xr, c * inner) - m);
    float inv = 1.f / block_sum(s, sh);
    for (long long c = threadIdx.x; c < len; c += blockDim.x) st(yr, c * inner, expf(ld(xr, c * inner) - m) * inv);
}

// One warp per row of at most 32·NR elements, held in registers: x is read once, the mean
// and the variance come from warp shuffles (no shared memory, no block barrier). Rows per
// block = blockDim.x / 32.
template <int NR>
__device__ __forceinline__ void layernorm_warp_body(const T* __restrict__ x, T* __restrict__ y, const T* __restrict__ g,
                                                    const T* __restrict__ b, int rows, int cols, float eps) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const T* xr = x + (long long)row * cols;
    T* yr = y + (long long)row * cols;
    float v[NR];
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < NR; ++j) {
        int c = lane + j * 32;
        v[j] = c < cols ? ld(xr, c) : 0.f;
        s += v[j];
    }
    float mean = warp_sum(s) / (float)cols;
    float q = 0.f;
#pragma unroll
    for (int j = 0; j < NR; ++j) {
        int c = lane + j * 32;
        float d = c < cols ? v[j] - mean : 0.f;
        q += d * d;
    }
    float rstd = rsqrtf(warp_sum(q) / (float)cols + eps);
#pragma unroll
    for (int j = 0; j < NR; ++j) {
        int c = lane + j * 32;
        if (c < cols) {
            float o = (v[j] - mean) * rstd * ld(g, c);
            if (b) o += ld(b, c);
            st(yr, c, o);
        }
    }
}

// LayerNorm over contiguous rows of at most 32·NV·VW elements, cols a multiple of VW and every
// operand 16-byte aligned: one warp per row, NV 16-byte vectors per lane, the row in registers.
template <int NV>
__device__ __forceinline__ void layernorm_wv_body(const T* __restrict__ x, T* __restrict__ y, const T* __restrict__ g,
                                                  const T* __restrict__ b, int rows, int cols, float eps) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const T* xr = x + (long long)row * cols;
    T* yr = y + (long long)row * cols;
    float v[NV][VW], gv[NV][VW], bv[NV][VW];
    float s = 0.f;
    // The scale and bias are loaded with x, not after the reductions: their latency then
    // overlaps x's instead of following the two warp sums (the row is latency-bound at
    // batch 1: one warp, a few 16-byte loads).
#pragma unroll
    for (int j = 0; j < NV; ++j) {
        int c = (lane + j * 32) * VW;
        if (c < cols) {
            ldv(xr, c, v[j]);
            ldv(g, c, gv[j]);
            if (b) ldv(b, c, bv[j]);
            else {
#pragma unroll
                for (int e = 0; e < VW; ++e) bv[j][e] = 0.f;
            }
        } else {
#pragma unroll
            for (int e = 0; e < VW; ++e) v[j][e] = 0.f;
        }
#pragma unroll
        for (int e = 0; e < VW; ++e) s += v[j][e];
    }
    float mean = warp_sum(s) / (float)cols;
    float q = 0.f;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
        if ((lane + j * 32) * VW >= cols) continue;
#pragma unroll
        for (int e = 0; e < VW; ++e) {
            float d = v[j][e] - mean;
            q += d * d;
        }
    }
    float rstd = rsqrtf(warp_sum(q) / (float)cols + eps);
#pragma unroll
    for (int j = 0; j < NV; ++j) {
        int c = (lane + j * 32) * VW;
        if (c >= cols) continue;
#pragma unroll
        for (int e = 0; e < VW; ++e) v[j][e] = (v[j][e] - mean) * rstd * gv[j][e] + bv[j][e];
        stv(yr, c, v[j]);
    }
}

// Softmax over contiguous rows of at most 32·NR elements, one warp per row, in registers.
template <int NR>
__device__ __forceinline__ void softmax_warp_body(const T* __restrict__ x, T* __restrict__ y, int rows, int len) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const T* xr = x + (long long)row * len;
    T* yr = y + (long long)row * len;
    float v[NR];
    float m = -3.402823466e38f;
#pragma unroll
    for (int j = 0; j < NR; ++j) {
        int c = lane + j * 32;
        v[j] = c < len ? ld(xr, c) : -3.402823466e38f;
        m = fmaxf(m, v[j]);
    }
    m = warp_max(m);
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < NR; ++j) {
        int c = lane + j * 32;
        v[j] = c < len ? expf(v[j] - m) : 0.f;
        s += v[j];
    }
    float inv = 1.f / warp_sum(s);
#pragma unroll
    for (int j = 0; j < NR; ++j) {
        int c = lane + j * 32;
        if (c < len) st(yr, c, v[j] * inv);
    }
}

// Output element i, counted in the output's storage order (NHWC or NCHW), as (n, c, oh, ow).
__device__ __forceinline__ void out_nchw(long long i, int C, int OH, int OW, bool nhwc, int& n, int& c, int& oh, int& ow) {
    if (nhwc) { c = i % C; long long r = i / C; ow = r % OW; r /= OW; oh = r % OH; n = r / OH; }
    else { ow = i % OW; long long r = i / OW; oh = r % OH; r /= OH; c = r % C; n = r / C; }
}

// Output element i of a 2-D window op (pool2d, resize2d: P has n, c, oh, ow and the strides
// xs, ys), counted as in out_nchw: its (oh, ow), its offset in y, and its input channel plane.
template <typename P>
__device__ __forceinline__ const T* window_out(const T* x, long long i, const P& p, int& oh, int& ow, long long& yo) {
    int n, c;
    out_nchw(i, p.c, p.oh, p.ow, p.ys[1] == 1, n, c, oh, ow);
    yo = n * p.ys[0] + c * p.ys[1] + oh * p.ys[2] + ow * p.ys[3];
    return x + n * p.xs[0] + c * p.xs[1];
}

// xs / ys: strides of x and y along (n, c, h, w): NCHW or NHWC storage alike.
struct PoolP { int n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, max, include_pad; long long xs[4], ys[4]; };
__device__ __forceinline__ signed char q8_byte(float v, float s, int fp8);
// The byte quantize_q8 makes of v once stored as T (rounded to the activation dtype first).
__device__ __forceinline__ signed char q8_of_stored(float v, float s, int fp8) {
    T t;
    st(&t, 0, v);
    return q8_byte(ld(&t, 0), s, fp8);
}
// A pooled value stored: as T, or (Q) as its byte by s, for quantized GEMMs that read the
// pool's output as bytes only (crate::plan::PoolStep::y_quant).
template <bool Q>
__device__ __forceinline__ void pool_store(void* y, long long i, float v, float s, int fp8) {
    if (Q) ((signed char*)y)[i] = q8_of_stored(v, s, fp8);
    else st((T*)y, i, v);
}
template <bool Q>
__device__ __forceinline__ void pool2d_body(const T* __restrict__ x, void* __restrict__ y, const PoolP& p, float s, int fp8) {
    long long total = (long long)p.n * p.c * p.oh * p.ow;
    GRID_STRIDE(i, total) {
        int oh, ow;
        long long yo;
        const T* xp = window_out(x, i, p, oh, ow, yo);
        int h0 = oh * p.sh - p.ph, w0 = ow * p.sw - p.pw;
        float acc = p.max ? -3.402823466e38f : 0.f;
        int cnt = 0;
        for (int a = 0; a < p.kh; ++a) {
            int hh = h0 + a * p.dh;
            if (hh < 0 || hh >= p.h) continue;
            for (int b = 0; b < p.kw; ++b) {
                int ww = w0 + b * p.dw;
                if (ww < 0 || ww >= p.w) continue;
                float v = ld(xp, hh * p.xs[2] + ww * p.xs[3]);
                if (p.max) acc = fmaxf(acc, v); else acc += v;
                ++cnt;
            }
        }
        if (!p.max) {
            int div = cnt;
            if (p.include_pad) {
                int he = min(h0 + (p.kh - 1) * p.dh + 1, p.h + p.ph), we = min(w0 + (p.kw - 1) * p.dw + 1, p.w + p.pw);
                div = ((he - h0 + p.dh - 1) / p.dh) * ((we - w0 + p.dw - 1) / p.dw);
            }
            acc = div > 0 ? acc / (float)div : 0.f;
        }
        pool_store<Q>(y, yo, acc, s, fp8);
    }
}
extern "C" __global__ void pool2d(const T* __restrict__ x, T* __restrict__ y, PoolP p) {
    pool2d_body<false>(x, y, p, 1.f, 0);
}
extern "C" __global__ void pool2d_q8(const T* __restrict__ x, signed char* __restrict__ y, PoolP p, float s, int fp8) {
    pool2d_body<true>(x, y, p, s, fp8);
}

// pool2d over NHWC values, VW channels per thread (16-byte loads), 32-bit indices: C a
// multiple of VW, x and y 16-byte aligned, n · oh · ow · C / VW below 2^31 (the Rust side checks).
// K3: a 3 × 3 window of dilation 1 (every resnet's max pool), its loops unrolled so that a
// thread's nine loads are in flight together rather than one after another.
template <bool Q, bool K3>
__device__ __forceinline__ void pool2d_v_body(const T* __restrict__ x, void* __restrict__ y, const PoolP& p, float s, int fp8) {
    int cv = p.c / VW;
    int total = p.n * p.oh * p.ow * cv;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        int c = (i % cv) * VW, r = i / cv;
        int ow = r % p.ow; r /= p.ow;
        int oh = r % p.oh, n = r / p.oh;
        const T* xp = x + n * p.xs[0] + c;
        int h0 = oh * p.sh - p.ph, w0 = ow * p.sw - p.pw;
        float acc[VW], v[VW];
#pragma unroll
        for (int j = 0; j < VW; ++j) acc[j] = p.max ? -3.402823466e38f : 0.f;
        int cnt = 0;
        const int kh = K3 ? 3 : p.kh, kw = K3 ? 3 : p.kw, dh = K3 ? 1 : p.dh, dw = K3 ? 1 : p.dw;
#pragma unroll
        for (int a = 0; a < (K3 ? 3 : kh); ++a) {
            int hh = h0 + a * dh;
            if (hh < 0 || hh >= p.h) continue;
#pragma unroll
            for (int b = 0; b < (K3 ? 3 : kw); ++b) {
                int ww = w0 + b * dw;
                if (ww < 0 || ww >= p.w) continue;
                ldv(xp, hh * p.xs[2] + ww * p.xs[3], v);
#pragma unroll
                for (int j = 0; j < VW; ++j) acc[j] = p.max ? fmaxf(acc[j], v[j]) : acc[j] + v[j];
                ++cnt;
            }
        }
        if (!p.max) {
            int div = cnt;
            if (p.include_pad) {
                int he = min(h0 + (p.kh - 1) * p.dh + 1, p.h + p.ph), we = min(w0 + (p.kw - 1) * p.dw + 1, p.w + p.pw);
                div = ((he - h0 + p.dh - 1) / p.dh) * ((we - w0 + p.dw - 1) / p.dw);
            }
#pragma unroll
            for (int j = 0; j < VW; ++j) acc[j] = div > 0 ? acc[j] / (float)div : 0.f;
        }
        long long yo = n * p.ys[0] + c + oh * p.ys[2] + ow * p.ys[3];
        if (Q) {
            // VW bytes, one 4- or 8-byte store (yo a multiple of VW).
            unsigned w[VW / 4];
#pragma unroll
            for (int j = 0; j < VW; ++j) {
                unsigned b = (unsigned char)q8_of_stored(acc[j], s, fp8);
                w[j / 4] = (j % 4 == 0 ? 0u : w[j / 4]) | (b << (8 * (j % 4)));
            }
            if (VW == 8) *(uint2*)((signed char*)y + yo) = make_uint2(w[0], w[VW / 4 - 1]);
            else *(unsigned*)((signed char*)y + yo) = w[0];
        } else {
            stv((T*)y, yo, acc);
        }
    }
}
__device__ __forceinline__ bool pool_k3(const PoolP& p) { return p.kh == 3 && p.kw == 3 && p.dh == 1 && p.dw == 1; }
extern "C" __global__ void pool2d_v(const T* __restrict__ x, T* __restrict__ y, PoolP p) {
    if (pool_k3(p)) pool2d_v_body<false, true>(x, y, p, 1.f, 0);
    else pool2d_v_body<false, false>(x, y, p, 1.f, 0);
}
extern "C" __global__ void pool2d_v_q8(const T* __restrict__ x, signed char* __restrict__ y, PoolP p, float s, int fp8) {
    if (pool_k3(p)) pool2d_v_body<true, true>(x, y, p, s, fp8);
    else pool2d_v_body<true, false>(x, y, p, s, fp8);
}

// ONNX Resize on H and W: the same f32 operations as isolane-engine's ResizeAttrs::source, so
// that nearest picks the same source pixel as the CPU backend. xs / ys as in pool2d.
struct ResizeP { int n, c, h, w, oh, ow, linear, coord, nearest, pad; float sh, sw; long long xs[4], ys[4]; };
__device__ __forceinline__ float resize_src(int i, int inp, int out, float scale, int coord) {
    switch (coord) {
    case 0: return ((float)i + 0.5f) / scale - 0.5f;                                   // half_pixel
    case 1: return out > 1 ? ((float)i + 0.5f) / scale - 0.5f : 0.f;                  // pytorch_half_pixel
    case 2: return out > 1 ? (float)i * ((float)inp - 1.f) / ((float)out - 1.f) : 0.f; // align_corners
    default: return (float)i / scale;                                                  // asymmetric
    }
}
__device__ __forceinline__ int resize_nearest(float xo, int inp, int mode) {
    bool tie = xo - truncf(xo) == 0.5f;
    float v;
    switch (mode) {
    case 0: v = tie ? floorf(xo) : roundf(xo); break;  // round_prefer_floor
    case 1: v = tie ? ceilf(xo) : roundf(xo); break;   // round_prefer_ceil
    case 2: v = floorf(xo); break;
    default: v = ceilf(xo);
    }
    return (int)fminf(fmaxf(v, 0.f), (float)(inp - 1));
}
extern "C" __global__ void resize2d(const T* __restrict__ x, T* __restrict__ y, ResizeP p) {
    long long total = (long long)p.n * p.c * p.oh * p.ow;
    GRID_STRIDE(i, total) {
        int oh, ow;
        long long yo;
        const T* xp = window_out(x, i, p, oh, ow, yo);
        float fy = resize_src(oh, p.h, p.oh, p.sh, p.coord), fx = resize_src(ow, p.w, p.ow, p.sw, p.coord);
        float v;
        if (p.linear) {
            float yc = fminf(fmaxf(fy, 0.f), (float)(p.h - 1)), xc = fminf(fmaxf(fx, 0.f), (float)(p.w - 1));
            int y0 = (int)floorf(yc), x0 = (int)floorf(xc);
            int y1 = min(y0 + 1, p.h - 1), x1 = min(x0 + 1, p.w - 1);
            float ly = yc - (float)y0, lx = xc - (float)x0;
            float top = ld(xp, y0 * p.xs[2] + x0 * p.xs[3]) * (1.f - lx) + ld(xp, y0 * p.xs[2] + x1 * p.xs[3]) * lx;
            float bot = ld(xp, y1 * p.xs[2] + x0 * p.xs[3]) * (1.f - lx) + ld(xp, y1 * p.xs[2] + x1 * p.xs[3]) * lx;
            v = top * (1.f - ly) + bot * ly;
        } else {
            int yy = resize_nearest(fy, p.h, p.nearest), xx = resize_nearest(fx, p.w, p.nearest);
            v = ld(xp, yy * p.xs[2] + xx * p.xs[3]);
        }
        st(y, yo, v);
    }
}

// One warp per row. kind: 0 mean, 1 sum, 2 max, 3 min, 4 L1, 5 sum of squares, 6 L2
// (model.rs's reduce_code; ReduceKind::apply is the definition). Min is max of the negation
// so that one warp_max serves both; the identities are +-inf so an all-(-inf) row gives -inf
// as the CPU backend does. L1/L2 accumulate |x| or x*x in f32: only the result is stored in T.
extern "C" __global__ void row_reduce(const T* __restrict__ x, T* __restrict__ y, long long rows, long long hw, int kind) {
    long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const T* xr = x + row * hw;
    const float NEG_INF = __int_as_float(0xff800000);
    bool extreme = kind == 2 || kind == 3;
    float sign = kind == 3 ? -1.f : 1.f;
    float s = extreme ? NEG_INF : 0.f;
    for (long long j = lane; j < hw; j += 32) {
        float v = ld(xr, j);
        if (kind == 4) v = fabsf(v);
        else if (kind >= 5) v = v * v;
        s = extreme ? fmaxf(s, sign * v) : s + v;
    }
    s = extreme ? sign * warp_max(s) : warp_sum(s);
    if (kind == 0) s /= (float)hw;
    if (kind == 6) s = sqrtf(s);
    if (lane == 0) st(y, row, s);
}

extern "C" __global__ void adaptive_pool(const T* __restrict__ x, T* __restrict__ y, int nc, int h, int w, int oh, int ow) {
    long long total = (long long)nc * oh * ow;
    GRID_STRIDE(i, total) {
        int j = i % ow; long long r = i / ow;
        int k = r % oh; r /= oh;
        int h0 = (k * h) / oh, h1 = ((k + 1) * h + oh - 1) / oh;
        int w0 = (j * w) / ow, w1 = ((j + 1) * w + ow - 1) / ow;
        const T* xp = x + r * h * w;
        float s = 0.f;
        for (int a = h0; a < h1; ++a) for (int b = w0; b < w1; ++b) s += ld(xp, (long long)a * w + b);
        st(y, i, s / (float)((h1 - h0) * (w1 - w0)));
    }
}

// Depthwise convolution, NCHW, one thread per output; bias, residual and activation fused.
// xs / ys: strides of x and y (and the residual) along (n, c, h, w).
// whwc: the filter is stored [kh, kw, M] (coalesced along m) instead of [M, kh, kw].
struct DwP { int n, c, h, w, m, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, act; float p0, p1; int whwc, pad_; long long xs[4], ys[4]; };
extern "C" __global__ void dwconv(const T* __restrict__ x, const T* __restrict__ wt, const T* __restrict__ bias,
                                  const T* __restrict__ res, T* __restrict__ y, DwP p) {
    long long total = (long long)p.n * p.m * p.oh * p.ow;
    int mult = p.m / p.c;
    GRID_STRIDE(i, total) {
        int ow, oh, m, n;
        out_nchw(i, p.m, p.oh, p.ow, p.ys[1] == 1, n, m, oh, ow);
        const T* xp = x + n * p.xs[0] + (m / mult) * p.xs[1];
        long long yo = n * p.ys[0] + m * p.ys[1] + oh * p.ys[2] + ow * p.ys[3];
        const T* wp = p.whwc ? wt + m : wt + (long long)m * p.kh * p.kw;
        int wstep = p.whwc ? p.m : 1;
        int h0 = oh * p.sh - p.ph, w0 = ow * p.sw - p.pw;
        float acc = 0.f;
        for (int a = 0; a < p.kh; ++a) {
            int hh = h0 + a * p.dh;
            if (hh < 0 || hh >= p.h) continue;
            for (int b = 0; b < p.kw; ++b) {
                int ww = w0 + b * p.dw;
                if (ww < 0 || ww >= p.w) continue;
                acc += ld(xp, hh * p.xs[2] + ww * p.xs[3]) * ld(wp, (long long)(a * p.kw + b) * wstep);
            }
        }
        if (bias) acc += ld(bias, m);
        if (res) acc += ld(res, yo);
        st(y, yo, act(acc, p.act, p.p0, p.p1));
    }
}

// NHWC x → col[(n, oh, ow), (a, b, c)], zero outside the padded input (all-zero bits are 0.0
// in every dtype). The column order matches the KRSC filter layout.
struct ImP { int n, h, w, c, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw; };
template <typename E, typename I>
__device__ __forceinline__ void im2col_body(const E* __restrict__ x, E* __restrict__ col, const ImP& p, I total) {
    I kk = (I)p.kh * p.kw * p.c;
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (I)gridDim.x * blockDim.x) {
        I r = i / kk; int j = (int)(i - r * kk);
        int c = j % p.c; int t = j / p.c; int b = t % p.kw; int a = t / p.kw;
        int ow = (int)(r % p.ow); I q = r / p.ow; int oh = (int)(q % p.oh); int n = (int)(q / p.oh);
        int ih = oh * p.sh - p.ph + a * p.dh, iw = ow * p.sw - p.pw + b * p.dw;
        E v = 0;
        if (ih >= 0 && ih < p.h && iw >= 0 && iw < p.w) v = x[(((long long)n * p.h + ih) * p.w + iw) * p.c + c];
        col[i] = v;
    }
}
extern "C" __global__ void im2col(const T* __restrict__ x, T* __restrict__ col, ImP p) {
    long long total = (long long)p.n * p.oh * p.ow * p.kh * p.kw * p.c;
    if (total < 2147483647LL) im2col_body<T, int>(x, col, p, (int)total);
    else im2col_body<T, long long>(x, col, p, total);
}
// im2col of quantized bytes (the int8 / fp8 GEMMs' activations as their producer left them),
// 4 channels per 32-bit word: p.c counts words (C / 4); a zero byte is 0 in int8 and e4m3.
extern "C" __global__ void im2col_b4(const unsigned int* __restrict__ x, unsigned int* __restrict__ col, ImP p) {
    long long total = (long long)p.n * p.oh * p.ow * p.kh * p.kw * p.c;
    if (total < 2147483647LL) im2col_body<unsigned int, int>(x, col, p, (int)total);
    else im2col_body<unsigned int, long long>(x, col, p, total);
}

// im2col over NHWC x with C a multiple of VW: VW channels (16 bytes, copied as they are) per
// thread; x and col 16-byte aligned, the total / VW below 2^31 (the Rust side checks).
extern "C" __global__ void im2col_v(const T* __restrict__ x, T* __restrict__ col, ImP p) {
    int cv = p.c / VW;
    int kkv = p.kh * p.kw * cv;
    int total = p.n * p.oh * p.ow * kkv;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        int r = i / kkv, j = i - r * kkv;
        int c = (j % cv) * VW, t = j / cv;
        int b = t % p.kw, a = t / p.kw;
        int ow = r % p.ow, q = r / p.ow;
        int oh = q % p.oh, n = q / p.oh;
        int ih = oh * p.sh - p.ph + a * p.dh, iw = ow * p.sw - p.pw + b * p.dw;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (ih >= 0 && ih < p.h && iw >= 0 && iw < p.w) v = *(const uint4*)(x + (((long long)n * p.h + ih) * p.w + iw) * p.c + c);
        *(uint4*)(col + (long long)i * VW) = v;
    }
}

// Depthwise convolution, NHWC, horizontal stride and dilation 1, kernel width KW, filter
// stored [kh, kw, M]: each thread computes 4 outputs along a row, sliding a register window
// over KW + 3 inputs per kernel row (instead of 4·KW loads).
template <int KW, typename I>
__device__ __forceinline__ void dw_s1(const T* __restrict__ x, const T* __restrict__ wt, const T* __restrict__ bias,
                                      const T* __restrict__ res, T* __restrict__ y, const DwP& p, I total) {
    int tiles = (p.ow + 3) / 4;
    int mult = p.m / p.c;
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (I)gridDim.x * blockDim.x) {
        int m = (int)(i % (I)p.m); I r = i / (I)p.m;
        int tw = r % tiles; r /= tiles;
        int oh = r % p.oh; int n = (int)(r / p.oh);
        int ow0 = tw * 4;
        const T* xp = x + n * p.xs[0] + (m / mult) * p.xs[1];
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        int h0 = oh * p.sh - p.ph, w0 = ow0 - p.pw;
        for (int a = 0; a < p.kh; ++a) {
            int hh = h0 + a * p.dh;
            if (hh < 0 || hh >= p.h) continue;
            float xin[KW + 3];
#pragma unroll
            for (int j = 0; j < KW + 3; ++j) {
                int ww = w0 + j;
                xin[j] = (ww >= 0 && ww < p.w) ? ld(xp, hh * p.xs[2] + ww * p.xs[3]) : 0.f;
            }
#pragma unroll
            for (int b = 0; b < KW; ++b) {
                float wv = ld(wt, (long long)(a * KW + b) * p.m + m);
#pragma unroll
                for (int o = 0; o < 4; ++o) acc[o] += xin[b + o] * wv;
            }
        }
        float bv = bias ? ld(bias, m) : 0.f;
#pragma unroll
        for (int o = 0; o < 4; ++o) {
            int ow = ow0 + o;
            if (ow >= p.ow) break;
            long long yo = n * p.ys[0] + m * p.ys[1] + oh * p.ys[2] + ow * p.ys[3];
            float v = acc[o] + bv;
            if (res) v += ld(res, yo);
            st(y, yo, act(v, p.act, p.p0, p.p1));
        }
    }
}


// Depthwise convolution, NHWC (x, y and the residual channel-contiguous), one filter per
// channel, horizontal stride and dilation 1, filter [kh, kw, M], M even: each thread computes
// 8 outputs along a row for 2 adjacent channels (one 2-element load per input, a register
// window of KW + 7 inputs per kernel row), with 32-bit index arithmetic where it fits.
#define DWC2_OUT 8
template <int KW, typename I>
__device__ __forceinline__ void dw_c2(const T* __restrict__ x, const T* __restrict__ wt, const T* __restrict__ bias,
                                      const T* __restrict__ res, T* __restrict__ y, const DwP& p, I total) {
    int pairs = p.m >> 1;
    int tiles = (p.ow + DWC2_OUT - 1) / DWC2_OUT;
    int xw = (int)p.xs[3];
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (I)gridDim.x * blockDim.x) {
        int m = (int)(i % (I)pairs) * 2; I r = i / (I)pairs;
        int tw = (int)(r % (I)tiles); r /= (I)tiles;
        int oh = (int)(r % (I)p.oh); int n = (int)(r / (I)p.oh);
        int ow0 = tw * DWC2_OUT;
        const T* xn = x + n * p.xs[0] + m;
        float a0[DWC2_OUT], a1[DWC2_OUT];
#pragma unroll
        for (int o = 0; o < DWC2_OUT; ++o) { a0[o] = 0.f; a1[o] = 0.f; }
        int h0 = oh * p.sh - p.ph, w0 = ow0 - p.pw;
        for (int a = 0; a < p.kh; ++a) {
            int hh = h0 + a * p.dh;
            if (hh < 0 || hh >= p.h) continue;
            const T* xr = xn + hh * p.xs[2];
            float x0[KW + DWC2_OUT - 1], x1[KW + DWC2_OUT - 1];
#pragma unroll
            for (int j = 0; j < KW + DWC2_OUT - 1; ++j) {
                int ww = w0 + j;
                if (ww >= 0 && ww < p.w) ld2(xr, ww * xw, x0[j], x1[j]);
                else { x0[j] = 0.f; x1[j] = 0.f; }
            }
            const T* wr = wt + a * KW * p.m + m;
#pragma unroll
            for (int b = 0; b < KW; ++b) {
                float w0v, w1v;
                ld2(wr, b * p.m, w0v, w1v);
#pragma unroll
                for (int o = 0; o < DWC2_OUT; ++o) {
                    a0[o] += x0[b + o] * w0v;
                    a1[o] += x1[b + o] * w1v;
                }
            }
        }
        float b0 = 0.f, b1 = 0.f;
        if (bias) ld2(bias, m, b0, b1);
#pragma unroll
        for (int o = 0; o < DWC2_OUT; ++o) {
            int ow = ow0 + o;
            if (ow >= p.ow) break;
            long long yo = n * p.ys[0] + m + oh * p.ys[2] + ow * p.ys[3];
            float v0 = a0[o] + b0, v1 = a1[o] + b1;
            if (res) { float r0, r1; ld2(res, yo, r0, r1); v0 += r0; v1 += r1; }
            st2(y, yo, act(v0, p.act, p.p0, p.p1), act(v1, p.act, p.p0, p.p1));
        }
    }
}

// Mean over hw of NHWC [n, hw, c] → [n, c]; one thread per (n, c), coalesced along c. Where
// n · c is small (a batch of one) that is few blocks of long dependent loops, and
// chan_mean_rows below is used instead (model/record.rs).
extern "C" __global__ void chan_mean(const T* __restrict__ x, T* __restrict__ y, long long n, long long c, long long hw) {
    GRID_STRIDE(i, n * c) {
        long long b = i / c, ch = i % c;
        const T* xp = x + b * hw * c + ch;
        float s = 0.f;
        for (long long j = 0; j < hw; ++j) s += ld(xp, j * c);
        st(y, i, s / (float)hw);
    }
}
// The same mean, a block (256 threads) a group of 32 channels of one item: thread (r, l) sums
// rows r, r + 8, ... of channel l (coalesced along c), and the 8 partial sums of a channel meet
// in shared memory. resnet50 at batch 1: chan_mean runs 8 blocks of 49 dependent loads each
// (12 µs under ncu, session 36); at batch 64 chan_mean is the faster (8.6 against 12.1 µs,
// session 37). The sum's order depends only on hw, not on the grid.
#define CHAN_MEAN_ROWS 8
extern "C" __global__ void chan_mean_rows(const T* __restrict__ x, T* __restrict__ y, long long n, long long c, long long hw) {
    __shared__ float part[CHAN_MEAN_ROWS][33];
    int lane = threadIdx.x & 31, r = threadIdx.x >> 5;
    long long groups = (c + 31) / 32;
    for (long long blk = blockIdx.x; blk < n * groups; blk += gridDim.x) {
        long long b = blk / groups, ch = (blk - b * groups) * 32 + lane;
        float s = 0.f;
        if (ch < c) {
            const T* xp = x + b * hw * c + ch;
            for (long long j = r; j < hw; j += CHAN_MEAN_ROWS) s += ld(xp, j * c);
        }
        part[r][lane] = s;
        __syncthreads();
        if (r == 0 && ch < c) {
            float t = 0.f;
#pragma unroll
            for (int k = 0; k < CHAN_MEAN_ROWS; ++k) t += part[k][lane];
            st(y, b * c + ch, t / (float)hw);
        }
        __syncthreads();
    }
}

// y = DequantizeLinear(QuantizeLinear(x)) (ONNX; isolane_engine::quant), in f32: an IEEE
// division, rounding half to even, saturation to [lo, hi] (integers) or float8 e4m3fn, then
// (q - z) * s. Element i uses channel (i / inner) % channels of scale[] and zp[], or s0 and z0
// when scale is null (per tensor).
extern "C" __global__ void fake_quant(const T* x, T* y, const T* __restrict__ scale, const T* __restrict__ zp,
                                      float s0, float z0, long long n, long long channels, long long inner,
                                      float lo, float hi, int fp8, int saturate) {
    GRID_STRIDE(i, n) {
        float s = s0, z = z0;
        if (scale) {
            long long c = (i / inner) % channels;
            s = ld(scale, c);
            z = ld(zp, c);
        }
        st(y, i, fake_quant_one(ld(x, i), s, z, lo, hi, fp8, saturate));
    }
}

// The byte of float8 e4m3fn holding r, a value on its grid (round_e4m3fn's result; NaN as
// 0x7f, e4m3fn's NaN): 1 sign, 4 exponent bits biased by 7, 3 mantissa bits (crate::int8::e4m3_bits).
__device__ __forceinline__ unsigned char e4m3_bits(float r) {
    unsigned int b = __float_as_uint(r);
    unsigned char sign = (b >> 31) ? 0x80 : 0;
    float a = fabsf(r);
    if (a != a) return 0x7f;
    if (a < 0.015625f) { int m = (int)rintf(a * 512.f); return sign | (unsigned char)(m > 7 ? 7 : m); }
    int e = (int)((b >> 23) & 0xff) - 127 + 7;
    return sign | (unsigned char)(e << 3) | (unsigned char)((b >> 20) & 7);
}

// The activations of an int8 / fp8 GEMM quantized (crate::int8::quantize_reference): x / s by
// one IEEE division, then round half to even saturated to [-128, 127] (int8; NaN, which int8
// cannot hold, to 0), or onto e4m3fn's grid saturated to +-448, stored as its byte (fp8).
__device__ __forceinline__ signed char q8_byte(float x, float s, int fp8) {
    float v = __fdiv_rn(x, s);
    if (fp8) return (signed char)e4m3_bits(round_e4m3fn(v, 1));
    return v != v ? (signed char)0 : (signed char)fminf(fmaxf(rintf(v), -128.f), 127.f);
}
extern "C" __global__ void quantize_q8(const T* __restrict__ x, signed char* __restrict__ q, float s,
                                       long long n, int fp8) {
    GRID_STRIDE(i, n) q[i] = q8_byte(ld(x, i), s, fp8);
}

// The value of e4m3fn byte b (NaN for 0x7f / 0xff).
__device__ __forceinline__ float e4m3_value(unsigned char b) {
    unsigned int e = (b >> 3) & 15, m = b & 7, sign = (unsigned int)(b >> 7) << 31;
    if (e == 15 && m == 7) return __int_as_float(0x7fc00000);
    if (e == 0) return __uint_as_float(sign | __float_as_uint((float)m * 0.001953125f));
    return __uint_as_float(sign | ((e - 7 + 127) << 23) | (m << 20));
}
// A quantized byte's value on its grid: int8, or e4m3fn when fp8.
__device__ __forceinline__ float q8_value(unsigned char b, bool fp8) {
    return fp8 ? e4m3_value(b) : (float)(signed char)b;
}

// y = q * s from quantized bytes (int8, or e4m3fn when fp8): the values the fake-quant kernel
// gives for the same x with zero point 0, for a quantized product's float alternative reading
// its producer's bytes (crate::plan::QuantFloat).
extern "C" __global__ void dequantize_q8(const signed char* __restrict__ q, T* __restrict__ y, float s,
                                         long long n, int fp8) {
    GRID_STRIDE(i, n) {
        float v = q8_value((unsigned char)q[i], fp8);
        st(y, i, __fmul_rn(v, s));
    }
}

// acc[r, c] = sum_k x[r, k] * w[c, k] on the CUDA cores, one output per thread: the int8 / fp8
// GEMM where cuBLASLt offers no tensor-core algorithm for a shape (slow, but the model runs).
// int8 (fp8 = 0): an exact int32 sum; e4m3 bytes (fp8 = 1): an f32 sum.
extern "C" __global__ void qgemm_fallback(const signed char* __restrict__ x, const signed char* __restrict__ w,
                                          void* acc, long long m, long long n, long long k, int fp8) {
    GRID_STRIDE(i, m * n) {
        long long r = i / n, c = i - r * n;
        const signed char* xr = x + r * k;
        const signed char* wc = w + c * k;
        if (fp8) {
            float s = 0.f;
            for (long long j = 0; j < k; ++j)
                s = fmaf(e4m3_value((unsigned char)xr[j]), e4m3_value((unsigned char)wc[j]), s);
            ((float*)acc)[i] = s;
        } else {
            int s = 0;
            for (long long j = 0; j < k; ++j) s += (int)xr[j] * (int)wc[j];
            ((int*)acc)[i] = s;
        }
    }
}

// The dequantizing epilogue of an int8 / fp8 GEMM (crate::int8::epilogue_reference):
// v = act(acc * scale[c] + bias[c] + res), c = i % n, one fused multiply-add; acc [rows, n] is
// int32 (fp8 = 0) or f32 (fp8 = 1), scale f32; bias and res may be null. v is stored in T
// (yq = 0), or quantized by ys for the next GEMM as quantize_q8 would (yq = 1: int8, 2: e4m3).
// The epilogue's value of output i (column c): one fused multiply-add, the residual, the
// activation (epi_math: dequant_body and the qgemm kernels share it, so every path computes the
// same bits).
// ACT: the activation known when compiled (0 none, 1 ReLU: act's cases 0 and 1, the same
// arithmetic), or -1 for act's switch on k.
template <int ACT>
__device__ __forceinline__ float epi_math(float a, float sc, float b, bool has_r, float r, int k, float p0, float p1) {
    float v = fmaf(a, sc, b);
    if (has_r) v += r;
    if (ACT == 0) return v;
    if (ACT == 1) return fmaxf(v, 0.f);
    return act(v, k, p0, p1);
}
// The residual's value at i: in T (rs = 0), or a byte of the GEMM's type (fp8: e4m3) times rs,
// as dequantize_q8 computes it but kept in f32.
__device__ __forceinline__ float res_value(const void* res, long long i, float rs, int fp8) {
    if (rs == 0.f) return ld((const T*)res, i);
    unsigned char b = ((const unsigned char*)res)[i];
    return __fmul_rn(q8_value(b, fp8), rs);
}
template <int ACT>
__device__ __forceinline__ float epi_value(float a, float sc, const T* __restrict__ bias, long long c, const void* res,
                                           long long i, int k, float p0, float p1, float rs, int fp8) {
    return epi_math<ACT>(a, sc, bias ? ld(bias, c) : 0.f, res != nullptr, res ? res_value(res, i, rs, fp8) : 0.f, k, p0,
                         p1);
}
// The byte of v for the next GEMM: v as stored in T first (what the FakeQuant step would have
// read), divided by ys, rounded and saturated as quantize_q8 does (YQ = 1: int8, 2: e4m3).
template <int YQ>
__device__ __forceinline__ unsigned char epi_byte(float v, float ys) {
    T t; st(&t, 0, v);
    float r = __fdiv_rn(ld(&t, 0), ys);
    if (YQ == 2) return e4m3_bits(round_e4m3fn(r, 1));
    return (unsigned char)(r != r ? (signed char)0 : (signed char)fminf(fmaxf(rintf(r), -128.f), 127.f));
}
// v stored at y[i]: in T (yq = 0), or as its byte (yq = 1: int8, 2: e4m3). YQ: yq known when
// compiled (0, 1, 2), or -1 (read at run time).
template <int YQ>
__device__ __forceinline__ void epi_store(void* y, long long i, float v, float ys, int yq) {
    if (YQ >= 0) yq = YQ;
    if (yq == 0) st((T*)y, i, v);
    else ((unsigned char*)y)[i] = yq == 2 ? epi_byte<2>(v, ys) : epi_byte<1>(v, ys);
}
template <typename I>
__device__ __forceinline__ void dequant_body(const void* __restrict__ acc, void* y, const float* __restrict__ scale,
                                             const T* __restrict__ bias, const void* res, I total, I n, int fp8,
                                             int k, float p0, float p1, float ys, int yq, float rs, int rf8) {
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (I)gridDim.x * blockDim.x) {
        I c = i % n;
        float a = fp8 ? ((const float*)acc)[i] : (float)((const int*)acc)[i];
        epi_store<-1>(y, i, epi_value<-1>(a, scale[c], bias, c, res, i, k, p0, p1, rs, rf8), ys, yq);
    }
}
// rs: a residual of bytes' scale (0: the residual is in T); rf8: those bytes are e4m3 (fp8 says
// only how acc is stored: cuDNN's int8 convolution writes f32 sums too).
extern "C" __global__ void dequant_epilogue(const void* __restrict__ acc, void* y, const float* __restrict__ scale,
                                            const T* __restrict__ bias, const void* res, long long total, long long n,
                                            int fp8, int k, float p0, float p1, float ys, int yq, float rs, int rf8) {
    if (total < 2147483647LL)
        dequant_body<int>(acc, y, scale, bias, res, (int)total, (int)n, fp8, k, p0, p1, ys, yq, rs, rf8);
    else dequant_body<long long>(acc, y, scale, bias, res, total, n, fp8, k, p0, p1, ys, yq, rs, rf8);
}

// Depthwise convolution, NHWC (x, y and the residual channel-contiguous), one filter per
// channel, filter [kh, kw, M], horizontal dilation 1: each thread computes VW channels (one
// 16-byte load per input pixel and filter tap) × OUTS outputs along a row, sliding a register
// window of (OUTS - 1) · SW + KW inputs per kernel row. M a multiple of VW, every operand
// 16-byte aligned, the total below 2^31 (the Rust side checks).
template <int KW, int SW, int OUTS>
__device__ __forceinline__ void dw_v(const T* __restrict__ x, const T* __restrict__ wt, const T* __restrict__ bias,
                                     const T* __restrict__ res, T* __restrict__ y, const DwP& p) {
    const int L = (OUTS - 1) * SW + KW;
    int cv = p.m / VW;
    int tiles = (p.ow + OUTS - 1) / OUTS;
    int total = p.n * p.oh * tiles * cv;
    int xw = (int)p.xs[3];
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        int c = (i % cv) * VW, r = i / cv;
        int tw = r % tiles; r /= tiles;
        int oh = r % p.oh, n = r / p.oh;
        int ow0 = tw * OUTS;
        const T* xn = x + n * p.xs[0] + c;
        float acc[OUTS][VW];
#pragma unroll
        for (int o = 0; o < OUTS; ++o)
#pragma unroll
            for (int j = 0; j < VW; ++j) acc[o][j] = 0.f;
        int h0 = oh * p.sh - p.ph, w0 = ow0 * SW - p.pw;
        for (int a = 0; a < p.kh; ++a) {
            int hh = h0 + a * p.dh;
            if (hh < 0 || hh >= p.h) continue;
            const T* xr = xn + hh * p.xs[2];
            float xin[L][VW];
#pragma unroll
            for (int s = 0; s < L; ++s) {
                int ww = w0 + s;
                if (ww >= 0 && ww < p.w) ldv(xr, (long long)ww * xw, xin[s]);
                else {
#pragma unroll
                    for (int j = 0; j < VW; ++j) xin[s][j] = 0.f;
                }
            }
#pragma unroll
            for (int b = 0; b < KW; ++b) {
                float wv[VW];
                ldv(wt, (long long)(a * KW + b) * p.m + c, wv);
#pragma unroll
                for (int o = 0; o < OUTS; ++o)
#pragma unroll
                    for (int j = 0; j < VW; ++j) acc[o][j] += xin[o * SW + b][j] * wv[j];
            }
        }
        float bv[VW], rv[VW];
        if (bias) ldv(bias, c, bv);
        else {
#pragma unroll
            for (int j = 0; j < VW; ++j) bv[j] = 0.f;
        }
#pragma unroll
        for (int o = 0; o < OUTS; ++o) {
            int ow = ow0 + o;
            if (ow >= p.ow) break;
            long long yo = n * p.ys[0] + c + oh * p.ys[2] + ow * p.ys[3];
            if (res) ldv(res, yo, rv);
#pragma unroll
            for (int j = 0; j < VW; ++j) acc[o][j] = act(acc[o][j] + bv[j] + (res ? rv[j] : 0.f), p.act, p.p0, p.p1);
            stv(y, yo, acc[o]);
        }
    }
}
"#;

const ATTENTION: &str = r#"
// Fused self-attention for head dim 64 on tensor cores (mma.sync m16n8k16, f32 accumulation):
// y = softmax(alpha · q kᵀ) v · oscale for each (image, head), flash-attention style (online
// softmax over key tiles of 64, the score matrix never leaves registers). q, k and v are read
// in place through (image, head, row) strides, y is written through its own (so the QKV
// split and the head merge cost nothing). One block = qwarps warps of 16 query rows each, of
// one head, times kg key groups: group j takes key tiles j, j + kg, ... with its own shared
// tiles (dynamic shared memory, attn_shared_bytes) and barrier, and the groups' partial softmax
// sums are merged at the end (more warps per block where batch × heads gives few blocks, as
// at batch 1). A tile's K and V arrive by cp.async in two groups, so the scores are computed
// while V is still on its way; the B fragments come from shared memory by ldmatrix.
struct AttnP { int s, heads, qtiles, qwarps; float scale_log2, oscale; long long qb, qh, kb, kh, vb, vh, yb, yh; int qr, kr, vr, yr; };
#define AD 64
#define AKT 64
#define ALD 72
__device__ __forceinline__ void mma16816(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.__MMA__.__MMA__.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Four 8×8 16-bit matrices from shared memory (lane i gives row i % 8 of matrix i / 8), as
// stored or transposed.
__device__ __forceinline__ void ldsm4(unsigned addr, unsigned* r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}
__device__ __forceinline__ void ldsm4t(unsigned addr, unsigned* r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}
// 16 bytes global → shared without registers; bytes = 0 writes zeros and reads nothing.
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(bytes) : "memory");
}
// Two floats → one register of two 16-bit values, lo in the low half.
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.__MMA__x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
extern "C" __global__ void __launch_bounds__(256) attention(const T* __restrict__ q, const T* __restrict__ k,
                                                            const T* __restrict__ v, T* __restrict__ y, AttnP p) {
#if __CUDA_ARCH__ >= 800
    extern __shared__ __align__(16) unsigned char attn_smem[];
    const float NEG_INF = __int_as_float(0xff800000);
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    // This thread's key group, its warp among the group's qwarps, its index in the group.
    int gthreads = p.qwarps * 32, kg = blockDim.x / gthreads;
    int grp = threadIdx.x / gthreads, gt = threadIdx.x - grp * gthreads, warp = gt >> 5;
    // The group's K tile then its V tile, AKT rows of ALD elements each (16-byte rows apart).
    unsigned ks = (unsigned)__cvta_generic_to_shared(attn_smem) + grp * 2 * AKT * ALD * (unsigned)sizeof(T);
    unsigned vs = ks + AKT * ALD * (unsigned)sizeof(T);
    int qt = blockIdx.x % p.qtiles;
    int bh = blockIdx.x / p.qtiles;
    int h = bh % p.heads, b = bh / p.heads;
    const T* qp = q + b * p.qb + h * p.qh;
    const T* kp = k + b * p.kb + h * p.kh;
    const T* vp = v + b * p.vb + h * p.vh;
    int r0 = qt * p.qwarps * 16 + warp * 16 + g, r1 = r0 + 8;
    // This warp's 16 query rows as A fragments (row g and g + 8; columns 2t.. and 2t + 8..).
    unsigned qa[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        int c = kk * 16 + 2 * t;
        qa[kk][0] = r0 < p.s ? *(const unsigned*)(qp + (long long)r0 * p.qr + c) : 0u;
        qa[kk][1] = r1 < p.s ? *(const unsigned*)(qp + (long long)r1 * p.qr + c) : 0u;
        qa[kk][2] = r0 < p.s ? *(const unsigned*)(qp + (long long)r0 * p.qr + c + 8) : 0u;
        qa[kk][3] = r1 < p.s ? *(const unsigned*)(qp + (long long)r1 * p.qr + c + 8) : 0u;
    }
    float o[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.f;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.f, l1 = 0.f;
    // ldmatrix: this lane's row (lane % 8) of matrix lane / 8.
    int lr = lane & 7, lm = lane >> 3;
    for (int kt = grp * AKT; kt < p.s; kt += kg * AKT) {
        // The groups take different numbers of tiles: each syncs on a barrier of its own.
        // This one: the group is done reading the previous tile.
        asm volatile("bar.sync %0, %1;" :: "r"(1 + grp), "r"(gthreads) : "memory");
        // K, then V (64 keys × 64, 16 bytes a copy) into shared memory; keys past the end are
        // zero (and their scores masked below).
        for (int i = gt; i < AKT * 8; i += gthreads) {
            int r = i >> 3, c = (i & 7) * 8;
            bool in = kt + r < p.s;
            cp_async16(ks + (r * ALD + c) * (unsigned)sizeof(T), kp + (long long)(in ? kt + r : 0) * p.kr + c, in ? 16 : 0);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
        for (int i = gt; i < AKT * 8; i += gthreads) {
            int r = i >> 3, c = (i & 7) * 8;
            bool in = kt + r < p.s;
            cp_async16(vs + (r * ALD + c) * (unsigned)sizeof(T), vp + (long long)(in ? kt + r : 0) * p.vr + c, in ? 16 : 0);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
        asm volatile("cp.async.wait_group 1;" ::: "memory");
        asm volatile("bar.sync %0, %1;" :: "r"(1 + grp), "r"(gthreads) : "memory");
        // Scores of 16 rows × 64 keys: 8 n-tiles of 8 keys. B fragments (key nt·8 + g,
        // dims 2t.. of each 8) for two k-steps per ldmatrix.
        float sc[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
            sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
#pragma unroll
            for (int kp2 = 0; kp2 < 2; ++kp2) {
                unsigned bf[4];
                ldsm4(ks + ((nt * 8 + lr) * ALD + kp2 * 32 + lm * 8) * (unsigned)sizeof(T), bf);
                mma16816(sc[nt], qa[2 * kp2], bf[0], bf[1]);
                mma16816(sc[nt], qa[2 * kp2 + 1], bf[2], bf[3]);
            }
        }
        // Scale (log2 domain), mask, online softmax; this thread holds rows g and g + 8.
        float mx0 = NEG_INF, mx1 = NEG_INF;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                bool ok = kt + nt * 8 + 2 * t + j < p.s;
                sc[nt][j] = ok ? sc[nt][j] * p.scale_log2 : NEG_INF;
                sc[nt][2 + j] = ok ? sc[nt][2 + j] * p.scale_log2 : NEG_INF;
                mx0 = fmaxf(mx0, sc[nt][j]);
                mx1 = fmaxf(mx1, sc[nt][2 + j]);
            }
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
        float c0 = exp2f(m0 - mn0), c1 = exp2f(m1 - mn1);
        m0 = mn0;
        m1 = mn1;
        l0 *= c0;
        l1 *= c1;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
            o[nt][0] *= c0; o[nt][1] *= c0; o[nt][2] *= c1; o[nt][3] *= c1;
        }
        // Probabilities as A fragments of P·V: n-tile 2kk → a0 / a1, 2kk + 1 → a2 / a3.
        unsigned pa[4][4];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
            float p00 = exp2f(sc[nt][0] - m0), p01 = exp2f(sc[nt][1] - m0);
            float p10 = exp2f(sc[nt][2] - m1), p11 = exp2f(sc[nt][3] - m1);
            l0 += p00 + p01;
            l1 += p10 + p11;
            pa[nt >> 1][(nt & 1) * 2] = pack2(p00, p01);
            pa[nt >> 1][(nt & 1) * 2 + 1] = pack2(p10, p11);
        }
        asm volatile("cp.async.wait_group 0;" ::: "memory");
        asm volatile("bar.sync %0, %1;" :: "r"(1 + grp), "r"(gthreads) : "memory");
        // o += P · V: B fragments (keys 2t, 2t + 1 and + 8 of the k-step, column g) from V
        // transposed, two n-tiles per ldmatrix.
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
            for (int np = 0; np < 4; ++np) {
                unsigned bf[4];
                ldsm4t(vs + ((kk * 16 + (lm & 1) * 8 + lr) * ALD + (2 * np + (lm >> 1)) * 8) * (unsigned)sizeof(T), bf);
                mma16816(o[2 * np], pa[kk], bf[0], bf[1]);
                mma16816(o[2 * np + 1], pa[kk], bf[2], bf[3]);
            }
        }
    }
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    if (kg > 1) {
        // Merge the key groups into group 0: each thread's (m, l, o) of its two rows, through
        // the shared tiles (free now), a group at a time. A group that had no tile has
        // m = -inf, l = 0, o = 0 and weighs nothing (group 0 always has one).
        float* sh = (float*)attn_smem;
        for (int j = 1; j < kg; ++j) {
            __syncthreads();
            if (grp == j) {
                float* d = sh + gt * 36;
                d[0] = m0; d[1] = m1; d[2] = l0; d[3] = l1;
#pragma unroll
                for (int nt = 0; nt < 8; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) d[4 + nt * 4 + e] = o[nt][e];
            }
            __syncthreads();
            if (grp == 0) {
                const float* d = sh + gt * 36;
                float n0 = fmaxf(m0, d[0]), n1 = fmaxf(m1, d[1]);
                float a0 = exp2f(m0 - n0), b0 = exp2f(d[0] - n0), a1 = exp2f(m1 - n1), b1 = exp2f(d[1] - n1);
                m0 = n0; m1 = n1;
                l0 = l0 * a0 + d[2] * b0;
                l1 = l1 * a1 + d[3] * b1;
#pragma unroll
                for (int nt = 0; nt < 8; ++nt) {
                    o[nt][0] = o[nt][0] * a0 + d[4 + nt * 4] * b0;
                    o[nt][1] = o[nt][1] * a0 + d[5 + nt * 4] * b0;
                    o[nt][2] = o[nt][2] * a1 + d[6 + nt * 4] * b1;
                    o[nt][3] = o[nt][3] * a1 + d[7 + nt * 4] * b1;
                }
            }
        }
        if (grp != 0) return;
    }
    float i0 = p.oscale / l0, i1 = p.oscale / l1;
    T* yp = y + b * p.yb + h * p.yh;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
        int c = nt * 8 + 2 * t;
        if (r0 < p.s) *(unsigned*)(yp + (long long)r0 * p.yr + c) = pack2(o[nt][0] * i0, o[nt][1] * i0);
        if (r1 < p.s) *(unsigned*)(yp + (long long)r1 * p.yr + c) = pack2(o[nt][2] * i1, o[nt][3] * i1);
    }
#else
    // Never launched: the planner fuses attention only on sm_80 and newer.
    __trap();
#endif
}
"#;

/// The quantized products' own tensor-core GEMM with the epilogue fused (`qgemm_i8`,
/// `qgemm_f8`: `crate::quant_gemm`'s own path, docs/cuda.md "int8 and fp8"). After the
/// attention kernel, whose `cp_async16` it uses.
const QGEMM: &str = r#"
// y[m, n] = epilogue(sum_k xq[m, k] * w[n, k]) for one-byte xq [M, K] and w [N, K], both rows
// K-contiguous (cuBLASLt's "TN"), by mma.sync m16n8k32 (int8: exact int32 sums, as cuBLASLt's;
// e4m3: f32 sums, sm_89 and newer), then epi_value / epi_store per element, so the int8 result
// is bit for bit the GEMM path's; ycopy (if set) also gets the bytes of y by scale cs (a
// residual's copy for the next GEMM, which a quantize kernel writes on the other paths).
// What cuBLASLt's int32 path costs and this does not: the [M, N] int32 accumulator written and
// read back (4 bytes an output, more than the int8 inputs and fp16 output together on 1x1
// layers) and a second launch. Block: 128 x 128 outputs (QBM x QBN), 8 warps of 64 x 32, K in
// tiles of 128 bytes by cp.async, QSTAGES deep (dynamic shared memory, QGEMM_SHARED_BYTES),
// rows padded to 144 bytes so that the fragment loads hit 32 distinct banks. The epilogue goes
// through shared memory a 16-row slice of a warp at a time, a lane a column: stores coalesce,
// and its code (the activation's switch) is not unrolled per accumulator, which made the first
// version's code ~1 MB and its every instruction a cache miss. K a multiple of 16 (whole
// 16-byte chunks), N even, xq and w 16-byte aligned (the Rust side checks). One block per
// (M tile, N tile), N tiles fastest: the blocks that share an M tile run together and read it
// from the L2.
#define QBM 128
#define QBN 128
#define QBK 128
#define QLD 144
#define QSTAGES 3
#define QELD 132
template <bool F8>
__device__ __forceinline__ void mma_q8(int* c, const unsigned* a, unsigned b0, unsigned b1) {
    if (F8) {
#if __CUDA_ARCH__ >= 890
        float* f = (float*)c;
        asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(f[0]), "+f"(f[1]), "+f"(f[2]), "+f"(f[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
    } else {
        asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}
// One stage: the block's 128 rows of xq and of w from k0, 8 chunks of 16 bytes a row, four
// chunks of each a thread; rows past M or N and chunks past K are zeros (they add nothing).
// Always one cp.async group, empty past the last tile, so that the waits count tiles.
__device__ __forceinline__ void qgemm_stage(const signed char* __restrict__ xq, const signed char* __restrict__ w,
                                            signed char* sa, int m0, int n0, int k0, int m, int n, int k, bool any) {
    if (any) {
        signed char* sb = sa + QBM * QLD;
#pragma unroll
        for (int h = 0; h < 4; ++h) {
            int chunk = threadIdx.x + h * 256, r = chunk >> 3, c = (chunk & 7) * 16, kc = k0 + c;
            bool ain = kc < k && m0 + r < m, bin = kc < k && n0 + r < n;
            cp_async16((unsigned)__cvta_generic_to_shared(sa + r * QLD + c),
                       ain ? (const void*)(xq + ((long long)(m0 + r) * k + kc)) : (const void*)xq, ain ? 16 : 0);
            cp_async16((unsigned)__cvta_generic_to_shared(sb + r * QLD + c),
                       bin ? (const void*)(w + ((long long)(n0 + r) * k + kc)) : (const void*)w, bin ? 16 : 0);
        }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
}
// Eight outputs of the qgemm epilogue (row, col .. col + 7; the residual's already loaded, or
// null): epi_value's arithmetic each, y stored as 16 bytes (or 8 bytes of its byte type), and
// the copy's 8 bytes.
// Eight bytes of v for the next GEMM, packed little-endian.
template <int YQ>
__device__ __forceinline__ uint2 epi_bytes8(const float* v, float s) {
    unsigned w[2] = {0u, 0u};
#pragma unroll
    for (int j = 0; j < 8; ++j) w[j >> 2] |= (unsigned)epi_byte<YQ>(v[j], s) << (8 * (j & 3));
    return make_uint2(w[0], w[1]);
}
template <bool F8, int ACT>
__device__ __forceinline__ void qgemm_out8(const int* a, int row, int col, int m, int n, const float* __restrict__ scale,
                                           const T* __restrict__ bias, bool has_r, uint4 rw, void* y, signed char* ycopy,
                                           int ak, float p0, float p1, float ys, int yq, float cs, float rs) {
    if (row >= m || col >= n) return;
    float r[8];
    if (rs != 0.f) {
        // A residual of bytes (rw.x, rw.y: 8 of them), each times its scale as res_value.
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            unsigned char b = (unsigned char)(((j < 4 ? rw.x : rw.y) >> (8 * (j & 3))) & 255u);
            r[j] = __fmul_rn(q8_value(b, F8), rs);
        }
    } else {
        u2f2(rw.x, r[0], r[1]);
        u2f2(rw.y, r[2], r[3]);
        u2f2(rw.z, r[4], r[5]);
        u2f2(rw.w, r[6], r[7]);
    }
    int4 a0 = *(const int4*)a, a1 = *(const int4*)(a + 4);
    int av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
    float4 s0 = *(const float4*)(scale + col), s1 = *(const float4*)(scale + col + 4);
    float sv[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
    float bv[8];
    if (bias) ldv(bias, col, bv);
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        float a = F8 ? __int_as_float(av[j]) : (float)av[j];
        v[j] = epi_math<ACT>(a, sv[j], bias ? bv[j] : 0.f, has_r, r[j], ak, p0, p1);
    }
    long long at = (long long)row * n + col;
    if (yq == 0) stv((T*)y, at, v);
    else *(uint2*)((unsigned char*)y + at) = epi_bytes8<F8 ? 2 : 1>(v, ys);
    if (ycopy) *(uint2*)((unsigned char*)ycopy + at) = epi_bytes8<F8 ? 2 : 1>(v, cs);
}
// The residual's 8 values at i as their raw bytes: 16 of T, or 8 bytes (rs != 0: a residual of
// bytes, 8-byte aligned as n and the run's column are multiples of 8) in .x and .y.
__device__ __forceinline__ uint4 qgemm_res8(const T* res, long long i, float rs) {
    if (rs == 0.f) return *(const uint4*)(res + i);
    uint2 b = *(const uint2*)((const unsigned char*)res + i);
    return make_uint4(b.x, b.y, 0u, 0u);
}
// The epilogue of a qgemm block whose 128 x 128 sums are in shared memory (ws, rows of QELD
// words): each thread takes 8 runs of 8 columns (a 16-byte residual load and y store, 16
// threads a row), every run's residual loaded before any is computed: the loads in flight are
// what a memory-bound 1x1 with a residual waits on.
template <bool F8, int ACT>
__device__ __forceinline__ void qgemm_epilogue(const int* ws, int m0, int n0, int m, int n, const float* __restrict__ scale,
                                               const T* __restrict__ bias, const T* res, void* y, signed char* ycopy,
                                               int ak, float p0, float p1, float ys, int yq, float cs, float rs) {
    // The residual's 8 values a run as their raw 16 bytes (T is 2 bytes in these modules).
    if (ACT >= 0) {
        uint4 rw[8];
#pragma unroll
        for (int s = 0; s < 8; ++s) {
            int it = threadIdx.x + s * 256, row = m0 + (it >> 4), col = n0 + (it & 15) * 8;
            rw[s] = res && row < m && col < n ? qgemm_res8(res, (long long)row * n + col, rs) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int s = 0; s < 8; ++s) {
            int it = threadIdx.x + s * 256;
            qgemm_out8<F8, ACT>(ws + (it >> 4) * QELD + (it & 15) * 8, m0 + (it >> 4), n0 + (it & 15) * 8, m, n, scale, bias,
                                res != nullptr, rw[s], y, ycopy, ak, p0, p1, ys, yq, cs, rs);
        }
    } else {
#pragma unroll 1
        for (int s = 0; s < 8; ++s) {
            int it = threadIdx.x + s * 256, row = m0 + (it >> 4), col = n0 + (it & 15) * 8;
            uint4 rw = res && row < m && col < n ? qgemm_res8(res, (long long)row * n + col, rs) : make_uint4(0, 0, 0, 0);
            qgemm_out8<F8, ACT>(ws + (it >> 4) * QELD + (it & 15) * 8, row, col, m, n, scale, bias, res != nullptr, rw,
                                y, ycopy, ak, p0, p1, ys, yq, cs, rs);
        }
    }
}
template <bool F8, int ACT>
__device__ __forceinline__ void qgemm_body(const signed char* __restrict__ xq, const signed char* __restrict__ w,
                                           void* y, const float* __restrict__ scale, const T* __restrict__ bias,
                                           const T* res, signed char* ycopy, int m, int n, int k, int ak,
                                           float p0, float p1, float ys, int yq, float cs, float rs) {
    extern __shared__ __align__(16) signed char qsm[];
    const int stage_bytes = (QBM + QBN) * QLD;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int g = lane >> 2, t4 = lane & 3;
    int wm = (warp >> 2) * 64, wn = (warp & 3) * 32;
    int ntiles = (n + QBN - 1) / QBN;
    int m0 = (int)(blockIdx.x / ntiles) * QBM, n0 = (int)(blockIdx.x % ntiles) * QBN;
    int acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0;  // 0.f has the same bits
    int ktiles = (k + QBK - 1) / QBK;
#pragma unroll
    for (int s = 0; s < QSTAGES - 1; ++s) qgemm_stage(xq, w, qsm + s * stage_bytes, m0, n0, s * QBK, m, n, k, s < ktiles);
    for (int kt = 0; kt < ktiles; ++kt) {
        // Tile kt has landed (at most QSTAGES - 2 later groups pending) and every warp is
        // done with the buffer the next load overwrites (tile kt - 1's).
        asm volatile("cp.async.wait_group %0;" :: "n"(QSTAGES - 2) : "memory");
        __syncthreads();
        int next = kt + QSTAGES - 1;
        qgemm_stage(xq, w, qsm + (next % QSTAGES) * stage_bytes, m0, n0, next * QBK, m, n, k, next < ktiles);
        const signed char* A = qsm + (kt % QSTAGES) * stage_bytes;
        const signed char* B = A + QBM * QLD;
#pragma unroll
        for (int kk = 0; kk < QBK; kk += 32) {
            unsigned af[4][4], bf[4][2];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const signed char* r = A + (wm + i * 16 + g) * QLD + kk + t4 * 4;
                af[i][0] = *(const unsigned*)r;
                af[i][1] = *(const unsigned*)(r + 8 * QLD);
                af[i][2] = *(const unsigned*)(r + 16);
                af[i][3] = *(const unsigned*)(r + 8 * QLD + 16);
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const signed char* r = B + (wn + j * 8 + g) * QLD + kk + t4 * 4;
                bf[j][0] = *(const unsigned*)r;
                bf[j][1] = *(const unsigned*)(r + 16);
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) mma_q8<F8>(acc[i][j], af[i], bf[j][0], bf[j][1]);
        }
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    __syncthreads();
    // The block's 128 x 128 sums through shared memory (rows of QELD words, 16-byte aligned).
    int* ws = (int*)qsm;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                int r = wm + i * 16 + g + 8 * h, c = wn + j * 8 + t4 * 2;
                *(int2*)(ws + r * QELD + c) = make_int2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
            }
    __syncthreads();
    qgemm_epilogue<F8, ACT>(ws, m0, n0, m, n, scale, bias, res, y, ycopy, ak, p0, p1, ys, yq, cs, rs);
}
// The entry points' dispatch on the activation (qgemm_body's ACT).
template <bool F8>
__device__ __forceinline__ void qgemm_by_act(const signed char* __restrict__ xq, const signed char* __restrict__ w,
                                             void* y, const float* __restrict__ scale, const T* __restrict__ bias,
                                             const T* res, signed char* ycopy, int m, int n, int k, int ak,
                                             float p0, float p1, float ys, int yq, float cs, float rs) {
    if (ak == 0) qgemm_body<F8, 0>(xq, w, y, scale, bias, res, ycopy, m, n, k, ak, p0, p1, ys, yq, cs, rs);
    else if (ak == 1) qgemm_body<F8, 1>(xq, w, y, scale, bias, res, ycopy, m, n, k, ak, p0, p1, ys, yq, cs, rs);
    else qgemm_body<F8, -1>(xq, w, y, scale, bias, res, ycopy, m, n, k, ak, p0, p1, ys, yq, cs, rs);
}
extern "C" __global__ void __launch_bounds__(256, 2) qgemm_i8(const signed char* __restrict__ xq, const signed char* __restrict__ w,
        void* y, const float* __restrict__ scale, const T* __restrict__ bias, const T* res, signed char* ycopy,
        int m, int n, int k, int ak, float p0, float p1, float ys, int yq, float cs, float rs) {
#if __CUDA_ARCH__ >= 800
    qgemm_by_act<false>(xq, w, y, scale, bias, res, ycopy, m, n, k, ak, p0, p1, ys, yq, cs, rs);
#else
    // Never launched: the build offers this path on sm_80 and newer only.
    __trap();
#endif
}
extern "C" __global__ void __launch_bounds__(256, 2) qgemm_f8(const signed char* __restrict__ xq, const signed char* __restrict__ w,
        void* y, const float* __restrict__ scale, const T* __restrict__ bias, const T* res, signed char* ycopy,
        int m, int n, int k, int ak, float p0, float p1, float ys, int yq, float cs, float rs) {
#if __CUDA_ARCH__ >= 890
    qgemm_by_act<true>(xq, w, y, scale, bias, res, ycopy, m, n, k, ak, p0, p1, ys, yq, cs, rs);
#else
    // Never launched: the build offers this path on sm_89 and newer only.
    __trap();
#endif
}
"#;

/// The 16-bit types' pair and vector accesses, over their `u2f2` / `f2u2` conversions.
const HALF_ACCESS: &str = r#"// Elements i and i + 1 (i even, the pointer 4-byte aligned).
__device__ __forceinline__ void ld2(const T* p, long long i, float& a, float& b) { u2f2(*(const unsigned*)(p + i), a, b); }
__device__ __forceinline__ void st2(T* p, long long i, float a, float b) { *(unsigned*)(p + i) = f2u2(a, b); }
// VW consecutive elements from i (i a multiple of VW, the pointer 16-byte aligned): one
// 16-byte load or store.
#define VW 8
__device__ __forceinline__ void ldv(const T* p, long long i, float* v) {
    uint4 q = *(const uint4*)(p + i);
    u2f2(q.x, v[0], v[1]); u2f2(q.y, v[2], v[3]); u2f2(q.z, v[4], v[5]); u2f2(q.w, v[6], v[7]); }
__device__ __forceinline__ void stv(T* p, long long i, const float* v) {
    *(uint4*)(p + i) = make_uint4(f2u2(v[0], v[1]), f2u2(v[2], v[3]), f2u2(v[4], v[5]), f2u2(v[6], v[7])); }
"#;

fn prelude(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => {
            r#"typedef float T;
__device__ __forceinline__ float ld(const T* p, long long i) { return p[i]; }
__device__ __forceinline__ void st(T* p, long long i, float v) { p[i] = v; }
// Elements i and i + 1 (i even, the pointer 8-byte aligned).
__device__ __forceinline__ void ld2(const T* p, long long i, float& a, float& b) {
    float2 v = *(const float2*)(p + i); a = v.x; b = v.y; }
__device__ __forceinline__ void st2(T* p, long long i, float a, float b) { *(float2*)(p + i) = make_float2(a, b); }
// VW consecutive elements from i (i a multiple of VW, the pointer 16-byte aligned): one
// 16-byte load or store.
#define VW 4
__device__ __forceinline__ void ldv(const T* p, long long i, float* v) {
    float4 q = *(const float4*)(p + i); v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w; }
__device__ __forceinline__ void stv(T* p, long long i, const float* v) {
    *(float4*)(p + i) = make_float4(v[0], v[1], v[2], v[3]); }
"#
        }
        DType::F16 => {
            r#"typedef unsigned short T;
__device__ __forceinline__ float ld(const T* p, long long i) {
    unsigned short h = p[i]; float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ void st(T* p, long long i, float v) {
    unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v)); p[i] = h; }
// Two 16-bit values in one register (lo first) to floats, and back (round to nearest even).
__device__ __forceinline__ void u2f2(unsigned v, float& a, float& b) {
    unsigned short lo = (unsigned short)(v & 0xffffu), hi = (unsigned short)(v >> 16);
    asm("cvt.f32.f16 %0, %1;" : "=f"(a) : "h"(lo));
    asm("cvt.f32.f16 %0, %1;" : "=f"(b) : "h"(hi)); }
__device__ __forceinline__ unsigned f2u2(float a, float b) {
    unsigned short lo, hi;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(lo) : "f"(a));
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(hi) : "f"(b));
    return (unsigned)lo | ((unsigned)hi << 16); }
"#
        }
        DType::Bf16 => {
            r#"typedef unsigned short T;
__device__ __forceinline__ float ld(const T* p, long long i) { return __uint_as_float(((unsigned)p[i]) << 16); }
__device__ __forceinline__ void st(T* p, long long i, float v) {
    unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v)); p[i] = h; }
// Two 16-bit values in one register (lo first) to floats, and back (round to nearest even).
__device__ __forceinline__ void u2f2(unsigned v, float& a, float& b) { a = __uint_as_float(v << 16); b = __uint_as_float(v & 0xffff0000u); }
__device__ __forceinline__ unsigned f2u2(float a, float b) {
    unsigned short lo, hi;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(lo) : "f"(a));
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(hi) : "f"(b));
    return (unsigned)lo | ((unsigned)hi << 16); }
"#
        }
    }
}

/// Kernels launched plainly even where programmatic dependent launch applies. The fused
/// attention kernel (large dynamic shared memory, launched after the QKV matmul): launched
/// early, vit_b_16 at batch 1 ran 0.478 ms in a process's first two builds and 0.51 ms from
/// the third on, every time (H200, session 26, five calls); launched plainly, 0.474–0.484 ms in
/// every build, the other kernels still launched early.
pub const PLAIN_LAUNCH: &[&str] = &["attention"];

/// The statement every kernel begins with ([`GRID_DEP_WAIT_FN`]).
pub const GRID_DEP_WAIT: &str = "grid_dep_wait();";

/// With programmatic dependent launch (sm_90 and newer, `CudaModel`'s `programmatic`), a kernel
/// may be scheduled while the kernel ahead of it on the stream is still finishing: the launch
/// latency overlaps that kernel's tail. Such a kernel must not touch memory before the one ahead
/// has completed and its writes are visible, which `griddepcontrol.wait` waits for. Every kernel
/// of the module begins with it (before any read, write or early return), so any of them may be
/// launched so; launched without the attribute, or compiled for an older GPU, it is nothing.
const GRID_DEP_WAIT_FN: &str = r#"__device__ __forceinline__ void grid_dep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
"#;

/// `src` with [`GRID_DEP_WAIT`] as the first statement of every `extern "C" __global__`
/// function (the first `{` after the declaration opens its body: parameter lists hold no
/// braces).
fn with_grid_dep_wait(src: &str) -> String {
    const DECL: &str = "extern \"C\" __global__";
    let mut out = String::with_capacity(src.len() + 4096);
    let mut rest = src;
    while let Some(at) = rest.find(DECL) {
        let Some(open) = rest[at..].find('{').map(|o| at + o + 1) else {
            break;
        };
        out.push_str(&rest[..open]);
        out.push(' ');
        out.push_str(GRID_DEP_WAIT);
        rest = &rest[open..];
    }
    out.push_str(rest);
    out
}

/// The complete CUDA source for one activation dtype.
pub fn source(dtype: DType) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "// isolane-cuda kernels, dtype {}\n",
        dtype.name()
    ));
    s.push_str(GRID_DEP_WAIT_FN);
    s.push_str(prelude(dtype));
    if dtype != DType::F32 {
        s.push_str(HALF_ACCESS);
    }
    s.push_str(&COMMON.replace("__MAX_RANK__", &MAX_RANK.to_string()));
    // Entry points of the templates: 32-bit index arithmetic when the size allows it.
    for (name, e) in [
        ("copy_strided", "T"),
        ("copy_w4", "unsigned int"),
        ("copy_w8", "uint2"),
        ("copy_w16", "uint4"),
    ] {
        s.push_str(&format!(
            "extern \"C\" __global__ void {name}(const {e}* __restrict__ x, {e}* __restrict__ y, long long n, Space s) {{\n    \
             if (n < 2147483647LL) copy_body<{e}, int>(x, y, (int)n, s); else copy_body<{e}, long long>(x, y, n, s);\n}}\n"
        ));
    }
    for kw in [3, 7] {
        s.push_str(&format!(
            "extern \"C\" __global__ void dwconv_s1_k{kw}(const T* x, const T* wt, const T* bias, const T* res, T* y, DwP p) {{\n    \
             long long total = (long long)p.n * p.oh * ((p.ow + 3) / 4) * p.m;\n    \
             if (total < 2147483647LL) dw_s1<{kw}, int>(x, wt, bias, res, y, p, (int)total);\n    \
             else dw_s1<{kw}, long long>(x, wt, bias, res, y, p, total);\n}}\n"
        ));
    }
    // The pair kernel for 7×7 (ConvNeXt).
    let kw = 7;
    s.push_str(&format!(
        "extern \"C\" __global__ void dwconv_c2_k{kw}(const T* x, const T* wt, const T* bias, const T* res, T* y, DwP p) {{\n    \
         long long total = (long long)p.n * p.oh * ((p.ow + DWC2_OUT - 1) / DWC2_OUT) * (p.m / 2);\n    \
         if (total < 2147483647LL) dw_c2<{kw}, int>(x, wt, bias, res, y, p, (int)total);\n    \
         else dw_c2<{kw}, long long>(x, wt, bias, res, y, p, total);\n}}\n"
    ));
    for &(kw, sw, outs) in DW_VEC_SHAPES {
        s.push_str(&format!(
            "extern \"C\" __global__ void {}(const T* x, const T* wt, const T* bias, const T* res, T* y, DwP p) {{\n    \
             dw_v<{kw}, {sw}, {outs}>(x, wt, bias, res, y, p);\n}}\n",
            dw_vec_name(kw, sw, outs)
        ));
    }
    for nr in WARP_ROW_PER_LANE {
        s.push_str(&format!(
            "extern \"C\" __global__ void layernorm_warp{nr}(const T* __restrict__ x, T* __restrict__ y, \
             const T* __restrict__ g, const T* __restrict__ b, int rows, int cols, float eps) {{\n    \
             layernorm_warp_body<{nr}>(x, y, g, b, rows, cols, eps);\n}}\n\
             extern \"C\" __global__ void softmax_warp{nr}(const T* __restrict__ x, T* __restrict__ y, int rows, int len) {{\n    \
             softmax_warp_body<{nr}>(x, y, rows, len);\n}}\n"
        ));
    }
    for nv in LN_VEC_PER_LANE {
        s.push_str(&format!(
            "extern \"C\" __global__ void layernorm_wv{nv}(const T* __restrict__ x, T* __restrict__ y, \
             const T* __restrict__ g, const T* __restrict__ b, int rows, int cols, float eps) {{\n    \
             layernorm_wv_body<{nv}>(x, y, g, b, rows, cols, eps);\n}}\n"
        ));
    }
    match dtype {
        DType::F32 => {}
        DType::F16 => s.push_str(&(ATTENTION.to_string() + STEM).replace("__MMA__", "f16")),
        DType::Bf16 => s.push_str(&(ATTENTION.to_string() + STEM).replace("__MMA__", "bf16")),
    }
    if dtype != DType::F32 {
        s.push_str(QGEMM);
        s.push_str(&qgemm_wgmma_source());
    }
    with_grid_dep_wait(&s)
}

/// 64-bit FNV-1a: stable across Rust versions and platforms (the std hasher is not promised
/// to be), which a key of an on-disk cache needs.
pub fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // Separator, so that ("ab", "c") and ("a", "bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Cache key of a compiled module: the source, the target architecture (`sm_90`), the NVRTC
/// version and the compile options all change the cubin.
pub fn cache_key(
    source: &str,
    arch: &str,
    nvrtc_version: (i32, i32),
    options: &[String],
) -> String {
    let ver = format!("{}.{}", nvrtc_version.0, nvrtc_version.1);
    let opts = options.join(" ");
    format!(
        "{arch}-{:016x}",
        fnv1a(&[
            source.as_bytes(),
            arch.as_bytes(),
            ver.as_bytes(),
            opts.as_bytes()
        ])
    )
}

/// `$XDG_CACHE_HOME/isolane/kernels`, else `~/.cache/isolane/kernels`; `None` when neither
/// variable is set (then nothing is cached).
pub fn cache_dir() -> Option<PathBuf> {
    cache_dir_from(
        std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from),
        std::env::var_os("HOME").map(PathBuf::from),
    )
}

pub fn cache_dir_from(xdg: Option<PathBuf>, home: Option<PathBuf>) -> Option<PathBuf> {
    let base = match (xdg, home) {
        (Some(x), _) if x.is_absolute() => x,
        (_, Some(h)) => h.join(".cache"),
        _ => return None,
    };
    Some(base.join("isolane").join("kernels"))
}

/// Reads a cached cubin.
pub fn cache_read(dir: &Path, key: &str) -> Option<Vec<u8>> {
    let data = std::fs::read(dir.join(format!("{key}.cubin"))).ok()?;
    // A cubin is an ELF file; anything else is a torn or foreign file.
    (data.len() > 4 && &data[..4] == b"\x7fELF").then_some(data)
}

/// Writes a cubin atomically (temp file + rename), so that concurrent compilers never read a
/// half-written file. Failure to cache is not an error: the kernels are compiled next time.
pub fn cache_write(dir: &Path, key: &str, data: &[u8]) {
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = dir.join(format!("{key}.cubin.{}.tmp", std::process::id()));
    if std::fs::write(&tmp, data).is_ok()
        && std::fs::rename(&tmp, dir.join(format!("{key}.cubin"))).is_err()
    {
        let _ = std::fs::remove_file(&tmp);
    }
}

#[cfg(test)]
mod tests {
    use half::{bf16, f16};

    /// `epi_byte<1>`'s byte of x (a value of the activation type): x / ys rounded to the
    /// nearest even and saturated, NaN to 0.
    fn divided(x: f32, ys: f32) -> i8 {
        let q = (x / ys).round_ties_even();
        if q.is_nan() {
            0
        } else {
            q.clamp(-128.0, 127.0) as i8
        }
    }

    /// `wg_bytes2`'s byte of x: x times 1/ys, rounded and saturated (`cvt.rni.sat.s8`), the
    /// division only where the product lies within 2^-14 of a half.
    fn multiplied(x: f32, ys: f32, margin: f32) -> i8 {
        let a = x * (1.0 / ys);
        if (a - a.round_ties_even()).abs() > 0.5 - margin {
            return divided(x, ys);
        }
        divided(a, 1.0)
    }

    /// Scales as calibration makes them (amax / 127, from 1e-4 to 1e2), log-uniform; powers of
    /// two and thirds; and four where the multiply alone rounds an f16 value differently from the
    /// division (found by a search over 3,000 random scales: 12 had such a value), e.g. 210.75 /
    /// 2.1839378 = 96.5 while 210.75 · (1 / 2.1839378) = 96.50001.
    fn scales() -> Vec<f32> {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut s: Vec<f32> = (0..96)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let u = (state >> 11) as f64 / (1u64 << 53) as f64;
                10f64.powf(-4.0 + 6.0 * u) as f32
            })
            .collect();
        s.extend([
            0.5f32,
            1.0,
            2.0,
            1.0 / 3.0,
            1.0 / 127.0,
            6.0 / 127.0,
            0.0078125,
        ]);
        s.extend([
            2.183_937_8f32,
            3.557_971_2,
            0.000_495_671_2,
            0.000_236_645_08,
        ]);
        s
    }

    #[test]
    fn the_hopper_kernels_byte_by_a_multiply_is_the_divisions() {
        // Every finite value of both activation types against every scale: the rule that keeps
        // qgemm_i8_wg's bytes the other paths' bit for bit.
        let values: Vec<f32> = (0..=u16::MAX)
            .flat_map(|b| [f16::from_bits(b).to_f32(), bf16::from_bits(b).to_f32()])
            .filter(|x| x.is_finite())
            .collect();
        for ys in scales() {
            for &x in &values {
                assert_eq!(
                    multiplied(x, ys, 2f32.powi(-14)),
                    divided(x, ys),
                    "x {x:e}, ys {ys:e}"
                );
            }
        }
        // Without the division near a half the product's rounding does differ: the test tells
        // the rule from none.
        assert_eq!(divided(210.75, 2.183_937_8), 96);
        assert_eq!(multiplied(210.75, 2.183_937_8, 0.0), 97);
        let differs = scales().iter().any(|&ys| {
            values
                .iter()
                .any(|&x| multiplied(x, ys, 0.0) != divided(x, ys))
        });
        assert!(differs);
    }
}
