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
    "row_mean",
    "adaptive_pool",
    "dwconv",
    "chan_mean",
    "im2col",
    "dwconv_s1_k3",
    "dwconv_s1_k7",
];

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
extern "C" __global__ void cast_out(const T* __restrict__ x, float* __restrict__ y, long long n) {
    GRID_STRIDE(i, n) y[i] = ld(x, i);
}

// y = act(x * scale[ch] + bias[ch] + res), ch = (i / inner) % channels; scale, bias and res
// may be null.
extern "C" __global__ void pointwise(const T* x, T* y, const T* __restrict__ scale, const T* __restrict__ bias,
                                     const T* res, long long n, long long channels, long long inner,
                                     int k, float p0, float p1) {
    GRID_STRIDE(i, n) {
        float v = ld(x, i);
        if (scale || bias) {
            long long ch = (i / inner) % channels;
            if (scale) v *= ld(scale, ch);
            if (bias) v += ld(bias, ch);
        }
        if (res) v += ld(res, i);
        st(y, i, act(v, k, p0, p1));
    }
}

// Operand 0 = y (written), 1 = a, 2 = b.
extern "C" __global__ void binary(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y,
                                  long long n, int op, Space s) {
    GRID_STRIDE(i, n) {
        long long r = i, oy = 0, oa = 0, ob = 0;
        for (int d = s.rank - 1; d >= 0; --d) {
            long long q = r % s.dims[d];
            r /= s.dims[d];
            oy += q * s.s0[d]; oa += q * s.s1[d]; ob += q * s.s2[d];
        }
        st(y, oy, binop(ld(a, oa), ld(b, ob), op));
    }
}

// Operand 0 = y, 1 = x.
extern "C" __global__ void copy_strided(const T* __restrict__ x, T* __restrict__ y, long long n, Space s) {
    GRID_STRIDE(i, n) {
        long long r = i, oy = 0, ox = 0;
        for (int d = s.rank - 1; d >= 0; --d) {
            long long q = r % s.dims[d];
            r /= s.dims[d];
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

// xs / ys: strides of x and y along (n, c, h, w): NCHW or NHWC storage alike.
struct PoolP { int n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, max, include_pad; long long xs[4], ys[4]; };
extern "C" __global__ void pool2d(const T* __restrict__ x, T* __restrict__ y, PoolP p) {
    long long total = (long long)p.n * p.c * p.oh * p.ow;
    GRID_STRIDE(i, total) {
        // i runs over (n, c, oh, ow) in the output's storage order.
        int ow, oh, c, n;
        if (p.ys[1] == 1) { c = i % p.c; long long r = i / p.c; ow = r % p.ow; r /= p.ow; oh = r % p.oh; n = r / p.oh; }
        else { ow = i % p.ow; long long r = i / p.ow; oh = r % p.oh; r /= p.oh; c = r % p.c; n = r / p.c; }
        const T* xp = x + n * p.xs[0] + c * p.xs[1];
        long long yo = n * p.ys[0] + c * p.ys[1] + oh * p.ys[2] + ow * p.ys[3];
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
        st(y, yo, acc);
    }
}

// One warp per row.
extern "C" __global__ void row_mean(const T* __restrict__ x, T* __restrict__ y, long long rows, long long hw) {
    long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const T* xr = x + row * hw;
    float s = 0.f;
    for (long long j = lane; j < hw; j += 32) s += ld(xr, j);
    s = warp_sum(s);
    if (lane == 0) st(y, row, s / (float)hw);
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
        if (p.ys[1] == 1) { m = i % p.m; long long r = i / p.m; ow = r % p.ow; r /= p.ow; oh = r % p.oh; n = r / p.oh; }
        else { ow = i % p.ow; long long r = i / p.ow; oh = r % p.oh; r /= p.oh; m = r % p.m; n = r / p.m; }
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
extern "C" __global__ void im2col(const T* __restrict__ x, T* __restrict__ col, ImP p) {
    long long kk = (long long)p.kh * p.kw * p.c;
    long long total = (long long)p.n * p.oh * p.ow * kk;
    GRID_STRIDE(i, total) {
        long long r = i / kk; int j = (int)(i - r * kk);
        int c = j % p.c; int t = j / p.c; int b = t % p.kw; int a = t / p.kw;
        int ow = r % p.ow; long long q = r / p.ow; int oh = q % p.oh; int n = (int)(q / p.oh);
        int ih = oh * p.sh - p.ph + a * p.dh, iw = ow * p.sw - p.pw + b * p.dw;
        T v = 0;
        if (ih >= 0 && ih < p.h && iw >= 0 && iw < p.w) v = x[(((long long)n * p.h + ih) * p.w + iw) * p.c + c];
        col[i] = v;
    }
}

// Depthwise convolution, NHWC, horizontal stride and dilation 1, kernel width KW, filter
// stored [kh, kw, M]: each thread computes 4 outputs along a row, sliding a register window
// over KW + 3 inputs per kernel row (instead of 4·KW loads).
template <int KW>
__device__ __forceinline__ void dw_s1(const T* __restrict__ x, const T* __restrict__ wt, const T* __restrict__ bias,
                                      const T* __restrict__ res, T* __restrict__ y, const DwP& p) {
    int tiles = (p.ow + 3) / 4;
    long long total = (long long)p.n * p.oh * tiles * p.m;
    int mult = p.m / p.c;
    GRID_STRIDE(i, total) {
        int m = i % p.m; long long r = i / p.m;
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
extern "C" __global__ void dwconv_s1_k3(const T* x, const T* wt, const T* bias, const T* res, T* y, DwP p) { dw_s1<3>(x, wt, bias, res, y, p); }
extern "C" __global__ void dwconv_s1_k7(const T* x, const T* wt, const T* bias, const T* res, T* y, DwP p) { dw_s1<7>(x, wt, bias, res, y, p); }

// Mean over hw of NHWC [n, hw, c] → [n, c]; one thread per (n, c), coalesced along c.
extern "C" __global__ void chan_mean(const T* __restrict__ x, T* __restrict__ y, long long n, long long c, long long hw) {
    GRID_STRIDE(i, n * c) {
        long long b = i / c, ch = i % c;
        const T* xp = x + b * hw * c + ch;
        float s = 0.f;
        for (long long j = 0; j < hw; ++j) s += ld(xp, j * c);
        st(y, i, s / (float)hw);
    }
}
"#;

fn prelude(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => {
            r#"typedef float T;
__device__ __forceinline__ float ld(const T* p, long long i) { return p[i]; }
__device__ __forceinline__ void st(T* p, long long i, float v) { p[i] = v; }
"#
        }
        DType::F16 => {
            r#"typedef unsigned short T;
__device__ __forceinline__ float ld(const T* p, long long i) {
    unsigned short h = p[i]; float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ void st(T* p, long long i, float v) {
    unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v)); p[i] = h; }
"#
        }
        DType::Bf16 => {
            r#"typedef unsigned short T;
__device__ __forceinline__ float ld(const T* p, long long i) { return __uint_as_float(((unsigned)p[i]) << 16); }
__device__ __forceinline__ void st(T* p, long long i, float v) {
    unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v)); p[i] = h; }
"#
        }
    }
}

/// The complete CUDA source for one activation dtype.
pub fn source(dtype: DType) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "// isolane-cuda kernels, dtype {}\n",
        dtype.name()
    ));
    s.push_str(prelude(dtype));
    s.push_str(&COMMON.replace("__MAX_RANK__", &MAX_RANK.to_string()));
    s
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
