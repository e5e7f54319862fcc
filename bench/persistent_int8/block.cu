// A feasibility study for issue 33's batch-1 int8 target, the step after chain.cu
// (results/h200-engine4/session37-persistent-chain-and-input-passes.md): one resnet50 identity
// bottleneck block (1x1 C -> P, 3x3 P -> P, 1x1 P -> C with the block's input added, ReLU
// after each) in ONE kernel, run by one thread-block cluster of 16 CTAs. The three products
// meet through distributed shared memory and the cluster's hardware barrier instead of three
// kernel launches (chain.cu: ~2.3 us a launch before any arithmetic at batch 1).
//
// Standalone (session 38 ran it on the H200; results in
// results/h200-engine4/session38-fused-block-on-a-cluster.md):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a block.cu -o block && ./block
// It checks every output byte against a one-thread-an-output reference of the three products,
// prints the fused block's time (CUDA graph of 32 copies) for layer3's block (14 x 14, C 1024,
// P 256) and layer4's (7 x 7, C 2048, P 512), and a timeline of one launch from each CTA's
// globaltimer. Session 36 measured those blocks as three cuDNN int8 graphs at ~13 and ~20 us.
// -DST1=1 tries another warp split for layer3's first product.
//
// Each CTA owns a slice of each product's output channels (P/16, P/16, C/16). Its products
// read their A operand straight from global memory (stage 1: the block's input) or from its
// shared memory (stages 2 and 3: the previous stage's output, whole in every CTA), and their B
// operand (weights, [N][K] K-contiguous) straight from global memory (L2), 16 bytes a thread a
// 64-wide K step. Warps split the m16 tiles, the n8 tiles and K as each shape needs; where they
// share K their int32 sums meet in shared memory by atomic adds (integers: exact in any order).
// A stage's epilogue stores its bytes into every CTA's shared memory (st.shared::cluster), and
// one cluster barrier publishes them. Epilogue as chain.cu's:
// y = sat(rint((acc * scale[n] + bias[n] (+ res * rs)) relu / ys)).
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cmath>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)

#define CL 16        // CTAs in the cluster
#define THREADS 256  // 8 warps a CTA

struct Stage {
    const int8_t* w;  // [n][k]
    const float* scale;
    const float* bias;
};
struct Block {
    const int8_t* x;  // [m][c], the block's input and its skip
    int8_t* y;        // [m][c]
    Stage s[3];
    int h, w, m, c, p;
    float rs, inv_ys;
};

__device__ __forceinline__ signed char sat8(float v) {
    float r = rintf(v);
    r = fminf(fmaxf(r, -128.f), 127.f);
    return (signed char)(int)r;
}
__device__ __forceinline__ float epi(int acc, float scale, float bias, bool has_res, int8_t res, float rs, float inv_ys) {
    float v = __fadd_rn(__fmul_rn((float)acc, scale), bias);
    if (has_res) v = __fadd_rn(v, __fmul_rn((float)res, rs));
    v = fmaxf(v, 0.f);
    return __fmul_rn(v, inv_ys);
}
__device__ __forceinline__ void mma(int* d, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// 16 bytes from CTA `rank`'s shared memory at the same offset as `local` has in ours.
__device__ __forceinline__ uint4 ld_peer16(const void* local, unsigned rank) {
    unsigned a = (unsigned)__cvta_generic_to_shared(local), r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
    uint4 v;
    asm volatile("ld.shared::cluster.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(r));
    return v;
}

// 16 bytes into CTA `rank`'s shared memory at the offset `local` has in ours. A store needs no
// round trip: the cluster barrier's release/acquire makes it visible.
__device__ __forceinline__ void st_peer16(void* local, unsigned rank, uint4 v) {
    unsigned a = (unsigned)__cvta_generic_to_shared(local), r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
    asm volatile("st.shared::cluster.v4.u32 [%0], {%1,%2,%3,%4};" ::"r"(r), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}

// The A operand of a stage: rows of `ld` bytes at `base` (global for stage 1, shared for 2 and
// 3). With `taps`, a 3x3 pad-1 window: k = tap * cin + channel, and a tap outside the image
// reads zeros.
struct ASrc {
    const int8_t* base;
    int ld;    // bytes between rows
    int cin;   // channels a tap (the K of a 1x1)
    int m, h, w;
    bool taps;
};

// K order inside each 64-wide step: thread t loads 16 contiguous bytes of A's row and of B's
// column at 16t. Bytes 0-7 feed the first m16n8k32's fragments, 8-15 the second's. A and B
// share the order, so each product is the same sum of the same integers (exact in any order).
__device__ __forceinline__ void mma2(int* d, const uint4& r0, const uint4& r1, const uint4& b) {
    unsigned a0[4] = {r0.x, r1.x, r0.y, r1.y}, a1[4] = {r0.z, r1.z, r0.w, r1.w};
    mma(d, a0, b.x, b.y);
    mma(d, a1, b.z, b.w);
}

// One warp's share of a stage: MT m16 tiles (tile0, tile0 + MSTEP, ...) by NT n8 tiles from
// column n0 of the weights ([N][K], K contiguous), over k64 steps [s0, s1). Its sums go to
// acc[row][acol + ...] (ld acc_ld), added atomically when other warps share the tile's K.
template <int MT, int NT, int U>
__device__ void warp_product(const ASrc& a, const int8_t* __restrict__ wt, int k, int n0, int tile0, int mstep,
                             int s0, int s1, int* acc, int acc_ld, int acol, bool add) {
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int d[MT][NT][4];
    int oy[MT][2], ox[MT][2];
    bool live[MT][2];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            int r = (tile0 + i * mstep) * 16 + g + 8 * hh;
            live[i][hh] = r < a.m;
            oy[i][hh] = r / a.w;
            ox[i][hh] = r - oy[i][hh] * a.w;
#pragma unroll
            for (int j = 0; j < NT; ++j) d[i][j][2 * hh] = d[i][j][2 * hh + 1] = 0;
        }
    const int8_t* rp[MT][2];
    int cps = a.cin / 64;  // steps a tap
    int tap = a.taps ? s0 / cps : 0, c = (s0 - (a.taps ? tap * cps : 0)) * 64;
    auto set_rows = [&]() {
        int dy = a.taps ? tap / 3 - 1 : 0, dx = a.taps ? tap % 3 - 1 : 0;
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                int iy = oy[i][hh] + dy, ix = ox[i][hh] + dx;
                bool in = live[i][hh] && iy >= 0 && iy < a.h && ix >= 0 && ix < a.w;
                rp[i][hh] = in ? a.base + (long long)(iy * a.w + ix) * a.ld + 16 * t : nullptr;
            }
    };
    set_rows();
    const int8_t* wp[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) wp[j] = wt + (long long)(n0 + 8 * j + g) * k + 16 * t;
    const uint4 z = make_uint4(0, 0, 0, 0);
    for (int s = s0; s < s1; s += U) {
        // U steps' loads in flight before their products: each B load is an L2 round trip.
        uint4 av[U][MT][2], bv[U][NT];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            bool in = s + u < s1;
#pragma unroll
            for (int j = 0; j < NT; ++j) bv[u][j] = in ? __ldg((const uint4*)(wp[j] + (long long)(s + u) * 64)) : z;
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) av[u][i][hh] = in && rp[i][hh] ? *(const uint4*)(rp[i][hh] + c) : z;
            if (in) {
                c += 64;
                if (c == a.cin && a.taps) { c = 0; ++tap; set_rows(); }
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int j = 0; j < NT; ++j) mma2(d[i][j], av[u][i][0], av[u][i][1], bv[u][j]);
    }
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                if (!live[i][e >> 1]) continue;
                int row = (tile0 + i * mstep) * 16 + g + (e >> 1) * 8, col = acol + 8 * j + 2 * t + (e & 1);
                if (add) atomicAdd(acc + row * acc_ld + col, d[i][j][e]);
                else acc[row * acc_ld + col] = d[i][j][e];
            }
}

// A stage's product for this CTA: NS output channels from n0, split over the 8 warps as MG
// m-groups x NG n-groups x KG k-groups (MG * NG * KG = 8).
template <int NS, int MG, int NG, int KG, int MT, int U>
__device__ void product(const ASrc& a, const int8_t* __restrict__ w, int n0, int k, int* acc) {
    static_assert(MG * NG * KG == 8, "eight warps");
    constexpr int NT = NS / 8 / NG;
    int warp = threadIdx.x >> 5, mg = warp % MG, ng = (warp / MG) % NG, kg = warp / (MG * NG);
    int steps = k / 64, per = (steps + KG - 1) / KG;
    int s0 = kg * per, s1 = min(steps, s0 + per);
    warp_product<MT, NT, U>(a, w, k, n0 + ng * NT * 8, mg, MG, s0, s1, acc, NS, ng * NT * 8, KG > 1);
}

// acc[m][NS] -> bytes, four columns a thread: into `out` (shared, [m][NS]) or, for the last
// stage, into y with the skip (`skip`, shared [m][NS]) added. `ep` holds this CTA's NS scales
// then NS biases (shared), so no step waits on global memory. Zeroes acc for the next stage.
template <int NS>
__device__ void epilogue(const Block& b, int n0, const float* ep, int* acc, const int8_t* skip, int8_t* out,
                         bool last) {
    constexpr int Q = NS / 4;  // 4-column groups a row
    for (int i = threadIdx.x; i < b.m * Q; i += THREADS) {
        int row = i / Q, col = 4 * (i - row * Q);
        int4 v = *(int4*)(acc + row * NS + col);
        char4 r = last ? *(const char4*)(skip + row * NS + col) : make_char4(0, 0, 0, 0);
        char4 o;
        o.x = sat8(epi(v.x, ep[col], ep[NS + col], last, r.x, b.rs, b.inv_ys));
        o.y = sat8(epi(v.y, ep[col + 1], ep[NS + col + 1], last, r.y, b.rs, b.inv_ys));
        o.z = sat8(epi(v.z, ep[col + 2], ep[NS + col + 2], last, r.z, b.rs, b.inv_ys));
        o.w = sat8(epi(v.w, ep[col + 3], ep[NS + col + 3], last, r.w, b.rs, b.inv_ys));
        if (last) *(char4*)(b.y + (long long)row * b.c + n0 + col) = o;
        else *(char4*)(out + row * NS + col) = o;
        *(int4*)(acc + row * NS + col) = make_int4(0, 0, 0, 0);
    }
}

// acc[m][NS] -> bytes, 16 columns a thread, stored into every CTA's `dst` ([m][ld], shared) at
// column `col0`: the next stage's input, whole in every CTA. Zeroes acc for the next stage.
template <int NS>
__device__ void epilogue_to_cluster(const Block& b, const float* ep, int* acc, int8_t* dst, int ld, int col0) {
    constexpr int Q = NS / 16;
    for (int i = threadIdx.x; i < b.m * Q; i += THREADS) {
        int row = i / Q, col = 16 * (i - row * Q);
        unsigned char o[16];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            int4 v = *(int4*)(acc + row * NS + col + 4 * q);
            *(int4*)(acc + row * NS + col + 4 * q) = make_int4(0, 0, 0, 0);
            int vs[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int c = col + 4 * q + e;
                o[4 * q + e] = (unsigned char)sat8(epi(vs[e], ep[c], ep[NS + c], false, 0, b.rs, b.inv_ys));
            }
        }
        uint4 w = *(uint4*)o;
        int8_t* at = dst + row * ld + col0 + col;
#pragma unroll 4
        for (unsigned r = 0; r < CL; ++r) st_peer16(at, r, w);
    }
}

__device__ __forceinline__ void stamp(long long* t, int i) {
    // globaltimer (ns) is one clock for every SM, so the CTAs' stamps compare.
    if (t && threadIdx.x == 0) {
        unsigned long long ns;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
        t[cluster_rank() * 16 + i] = (long long)ns;
    }
}

// P = 16 * S (S = P / CL: 16 for layer3, 32 for layer4); C = 4P. Launched as one cluster of
// CL CTAs (launch_block: 16 is a non-portable cluster size, opted into at run time).
// Warp splits: layer3 (13 m-tiles) splits stages 1-2 into 4 m-groups x 2 k-groups and stage 3
// into 2 m-groups x 4 n-groups; layer4 (4 m-tiles) keeps every m-tile in each warp.
template <int S>
__global__ void __launch_bounds__(THREADS, 1) block_fused(Block b, long long* stamps) {
    constexpr int S3 = 4 * S;  // stage 3's slice: C / CL
    constexpr bool L3 = S == 16;
    extern __shared__ __align__(16) unsigned char smem[];
    int mp = (b.m + 15) / 16 * 16, ldf = b.p + 16;  // padded rows: fewer bank conflicts
    int* acc = (int*)smem;                                  // [mp][S3] int32
    int8_t* full1 = (int8_t*)(acc + mp * S3);               // [mp][ldf] stage 2's input, from every CTA
    int8_t* full2 = full1 + mp * ldf;                       // [mp][ldf] stage 3's
    int8_t* skip = full2 + mp * ldf;                        // [mp][S3] the block's input, this CTA's channels
    float* ep = (float*)(skip + mp * S3);                   // scales and biases: 2S, 2S, 2S3
    unsigned rank = cluster_rank();
    stamp(stamps, 0);
    for (int i = threadIdx.x; i < mp * S3; i += THREADS) acc[i] = 0;
    // Everything the epilogues read, brought in while stage 1 starts.
    for (int i = threadIdx.x; i < 2 * S; i += THREADS) {
        int st = i / S, j = i - st * S;
        ep[st * 2 * S + j] = b.s[st].scale[rank * S + j];
        ep[st * 2 * S + S + j] = b.s[st].bias[rank * S + j];
    }
    for (int j = threadIdx.x; j < S3; j += THREADS) {
        ep[4 * S + j] = b.s[2].scale[rank * S3 + j];
        ep[4 * S + S3 + j] = b.s[2].bias[rank * S3 + j];
    }
    for (int i = threadIdx.x; i < b.m * (S3 / 16); i += THREADS) {
        int row = i / (S3 / 16), ch = i - row * (S3 / 16);
        *(uint4*)(skip + row * S3 + 16 * ch) = *(const uint4*)(b.x + (long long)row * b.c + rank * S3 + 16 * ch);
    }
    __syncthreads();
    // Stage 1: 1x1, K = C, from the block's input in global memory.
    ASrc a1{b.x, b.c, b.c, b.m, b.h, b.w, false};
#ifndef ST1
#define ST1 0
#endif
    if (L3 && ST1) product<S, 8, 1, 1, 2, 4>(a1, b.s[0].w, rank * S, b.c, acc);
    else if (L3) product<S, 4, 1, 2, 4, 2>(a1, b.s[0].w, rank * S, b.c, acc);
    else product<S, 1, 2, 4, 4, 2>(a1, b.s[0].w, rank * S, b.c, acc);
    __syncthreads();
    stamp(stamps, 1);
    epilogue_to_cluster<S>(b, ep, acc, full1, ldf, rank * S);
    stamp(stamps, 7);
    cluster_sync();
    stamp(stamps, 2);
    // Stage 2: 3x3, K = 9P, from `full1`.
    ASrc a2{full1, ldf, b.p, b.m, b.h, b.w, true};
    if (L3) product<S, 4, 1, 2, 4, 3>(a2, b.s[1].w, rank * S, 9 * b.p, acc);
    else product<S, 1, 2, 4, 4, 3>(a2, b.s[1].w, rank * S, 9 * b.p, acc);
    __syncthreads();
    stamp(stamps, 3);
    epilogue_to_cluster<S>(b, ep + 2 * S, acc, full2, ldf, rank * S);
    stamp(stamps, 8);
    cluster_sync();
    stamp(stamps, 4);
    // Stage 3: 1x1, K = P, from `full`, the skip added, into y.
    ASrc a3{full2, ldf, b.p, b.m, b.h, b.w, false};
    if (L3) product<S3, 2, 4, 1, 7, 2>(a3, b.s[2].w, rank * S3, b.p, acc);
    else product<S3, 1, 8, 1, 4, 2>(a3, b.s[2].w, rank * S3, b.p, acc);
    __syncthreads();
    stamp(stamps, 5);
    epilogue<S3>(b, rank * S3, ep + 4 * S, acc, skip, nullptr, true);
    stamp(stamps, 6);
}

// The reference: one product, one thread an output, the same float operations.
__global__ void product_ref(const int8_t* x, const int8_t* w, const float* scale, const float* bias, const int8_t* res,
                            int8_t* y, int h, int wd, int c, int n, int ks, float rs, float inv_ys) {
    int m = h * wd;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)m * n) return;
    int row = i / n, o = i % n, oy = row / wd, ox = row % wd, pad = ks / 2;
    int acc = 0;
    for (int ky = 0; ky < ks; ++ky)
        for (int kx = 0; kx < ks; ++kx) {
            int iy = oy + ky - pad, ix = ox + kx - pad;
            if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
            for (int ch = 0; ch < c; ++ch)
                acc += (int)x[(iy * wd + ix) * c + ch] * (int)w[(long long)o * ks * ks * c + (ky * ks + kx) * c + ch];
        }
    y[i] = sat8(epi(acc, scale[o], bias[o], res != nullptr, res ? res[i] : 0, rs, inv_ys));
}

static uint32_t rng = 12345;
static int rnd(int lo, int hi) { rng = rng * 1664525u + 1013904223u; return lo + (int)((rng >> 8) % (uint32_t)(hi - lo + 1)); }
template <typename T> static T* upload(const std::vector<T>& v) {
    T* d; CK(cudaMalloc(&d, v.size() * sizeof(T))); CK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice)); return d;
}
static Stage make_stage(int n, int k) {
    std::vector<int8_t> w((size_t)n * k);
    for (auto& v : w) v = (int8_t)rnd(-20, 20);
    std::vector<float> sc(n), bi(n);
    float base = 1.f / (std::sqrt((float)k) * 40.f * 12.f);
    for (int i = 0; i < n; ++i) { sc[i] = base * (0.5f + rnd(0, 100) / 100.f); bi[i] = (rnd(0, 200) - 100) / 400.f; }
    return Stage{upload(w), upload(sc), upload(bi)};
}

template <int S>
static void run(int hw) {
    int p = 16 * S, c = 4 * p, m = hw * hw, mp = (m + 15) / 16 * 16;
    std::vector<int8_t> xh((size_t)m * c);
    for (auto& v : xh) v = (int8_t)rnd(0, 80);
    Block b{};
    b.x = upload(xh);
    CK(cudaMalloc(&b.y, (size_t)m * c));
    b.s[0] = make_stage(p, c);
    b.s[1] = make_stage(p, 9 * p);
    b.s[2] = make_stage(c, p);
    b.h = b.w = hw; b.m = m; b.c = c; b.p = p; b.rs = 1.f / 40.f; b.inv_ys = 40.f;
    size_t smem = (size_t)mp * 4 * S * 4 + (size_t)2 * mp * (p + 16) + (size_t)mp * 4 * S + (size_t)12 * S * 4;
    CK(cudaFuncSetAttribute(block_fused<S>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    CK(cudaFuncSetAttribute(block_fused<S>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    // The reference, product by product.
    int8_t *t1, *t2, *yr;
    CK(cudaMalloc(&t1, (size_t)m * p)); CK(cudaMalloc(&t2, (size_t)m * p)); CK(cudaMalloc(&yr, (size_t)m * c));
    product_ref<<<(m * p + 255) / 256, 256>>>(b.x, b.s[0].w, b.s[0].scale, b.s[0].bias, nullptr, t1, hw, hw, c, p, 1, b.rs, b.inv_ys);
    product_ref<<<(m * p + 255) / 256, 256>>>(t1, b.s[1].w, b.s[1].scale, b.s[1].bias, nullptr, t2, hw, hw, p, p, 3, b.rs, b.inv_ys);
    product_ref<<<(m * c + 255) / 256, 256>>>(t2, b.s[2].w, b.s[2].scale, b.s[2].bias, b.x, yr, hw, hw, p, c, 1, b.rs, b.inv_ys);
    CK(cudaDeviceSynchronize());
    cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    long long* stamps_d; CK(cudaMalloc(&stamps_d, CL * 16 * sizeof(long long)));
    auto launch_block = [&](long long* stamps) {
        cudaLaunchConfig_t cfg{};
        cfg.gridDim = dim3(CL); cfg.blockDim = dim3(THREADS); cfg.dynamicSmemBytes = smem; cfg.stream = st;
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = CL; at[0].val.clusterDim.y = 1; at[0].val.clusterDim.z = 1;
        cfg.attrs = at; cfg.numAttrs = 1;
        CK(cudaLaunchKernelEx(&cfg, block_fused<S>, b, stamps));
    };
    launch_block(nullptr);
    CK(cudaStreamSynchronize(st));
    std::vector<int8_t> got((size_t)m * c), want((size_t)m * c);
    CK(cudaMemcpy(got.data(), b.y, got.size(), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(want.data(), yr, want.size(), cudaMemcpyDeviceToHost));
    long long bad = 0, zeros = 0;
    for (size_t i = 0; i < got.size(); ++i) { bad += got[i] != want[i]; zeros += want[i] == 0; }
    printf("block %dx%d, C %d, P %d: %lld of %zu bytes differ from the reference (%.1f%% of its bytes 0); %zu B shared a CTA\n",
           hw, hw, c, p, bad, got.size(), 100.0 * zeros / got.size(), smem);
    const int reps = 32;
    cudaGraph_t g; cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int r = 0; r < reps; ++r) launch_block(nullptr);
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, st));
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    std::vector<float> t;
    for (int i = 0; i < 30; ++i) {
        CK(cudaEventRecord(e0, st)); CK(cudaGraphLaunch(ge, st)); CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    printf("  fused block: median %.2f us a block (%d in a graph)\n", 1e3 * t[t.size() / 2] / reps, reps);
    // Where one block's time goes: each CTA's globaltimer at the stage boundaries, 20 runs. For
    // each point: ns since the first CTA started (CTA 0, and the slowest CTA), medians.
    const int pts[10] = {0, 1, 7, 2, 3, 8, 4, 5, 6, 6};
    const char* names[10] = {"start", "stage 1 product", "epilogue 1 to the cluster", "cluster barrier", "stage 2 product",
                             "epilogue 2 to the cluster", "cluster barrier", "stage 3 product", "epilogue 3", "end"};
    std::vector<std::vector<long long>> r0(10), slow(10);
    for (int r = 0; r < 20; ++r) {
        CK(cudaMemset(stamps_d, 0, CL * 16 * sizeof(long long)));
        launch_block(stamps_d);
        CK(cudaStreamSynchronize(st));
        long long h[CL * 16]; CK(cudaMemcpy(h, stamps_d, sizeof h, cudaMemcpyDeviceToHost));
        long long t0 = h[0];
        for (int q = 0; q < CL; ++q) t0 = std::min(t0, h[q * 16]);
        for (int i = 0; i < 10; ++i) {
            long long mx = 0;
            for (int q = 0; q < CL; ++q) mx = std::max(mx, h[q * 16 + pts[i]] - t0);
            r0[i].push_back(h[pts[i]] - t0);
            slow[i].push_back(mx);
        }
    }
    printf("  timeline, ns (CTA 0 / slowest CTA):");
    for (int i = 0; i < 10; ++i) {
        std::sort(r0[i].begin(), r0[i].end()); std::sort(slow[i].begin(), slow[i].end());
        printf(" %s %lld/%lld;", names[i], r0[i][10], slow[i][10]);
    }
    printf("\n");
}

int main() {
    run<16>(14);  // layer3's identity block
    run<32>(7);   // layer4's
    return 0;
}
