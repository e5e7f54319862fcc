// A feasibility study for issue 33's batch-1 int8 target, the step after chain.cu
// (results/h200-engine4/session37-persistent-chain-and-input-passes.md): one resnet50 identity
// bottleneck block (1x1 C -> P, 3x3 P -> P, 1x1 P -> C with the block's input added, ReLU
// after each) in ONE kernel, run by one thread-block cluster of 16 CTAs. The three products
// meet through distributed shared memory and the cluster's hardware barrier instead of three
// kernel launches (chain.cu: ~2.3 us a launch before any arithmetic at batch 1).
//
// Status: written in session 37 after the device time was spent; compiled here by NVRTC only,
// NOT YET RUN on a GPU. Standalone:
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a block.cu -o block && ./block
// It checks every output byte against a one-thread-an-output reference of the three products
// and prints the fused block's time (CUDA graph of 32 copies) for layer3's block (14 x 14,
// C 1024, P 256) and layer4's (7 x 7, C 2048, P 512). Session 36 measured those blocks as
// three cuDNN int8 graphs at ~13 and ~20 us a block.
//
// Each CTA owns a slice of each product's output channels (P/16, P/16, C/16). Its products
// read their A fragments straight from global memory (stage 1: the block's input) or from its
// shared memory (stages 2 and 3: the previous stage's output, gathered from the 16 CTAs'
// slices), and their B fragments (weights, [N][K] K-contiguous) straight from global memory
// (L2). Warps split the m16 tiles and, where there are fewer than 8, K; their int32 partial
// sums meet in shared memory by atomic adds (integers: exact in any order). Epilogue as
// chain.cu's: y = sat(rint((acc * scale[n] + bias[n] (+ res * rs)) relu / ys)).
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

// The A operand of a stage: row m's 4 bytes at column k (k a multiple of 4), zero where the
// row has no source (past M, or a 3x3 tap outside the image).
struct ARows {
    const int8_t* base;  // global (stage 1) or shared (stages 2, 3)
    int ld;              // bytes a row
    int m, h, w;
    bool taps;           // 3x3, pad 1: k = tap * ld + channel
    __device__ __forceinline__ unsigned at(int row, int k) const {
        if (row >= m) return 0u;
        if (!taps) return *(const unsigned*)(base + (long long)row * ld + k);
        int tap = k / ld, c = k - tap * ld, ky = tap / 3, kx = tap - 3 * ky;
        int oy = row / w, ox = row - oy * w, iy = oy + ky - 1, ix = ox + kx - 1;
        if (iy < 0 || iy >= h || ix < 0 || ix >= w) return 0u;
        return *(const unsigned*)(base + (long long)(iy * w + ix) * ld + c);
    }
};

// One stage's product for this CTA: rows 0..m of A, its NS output channels from n0, K; the
// sums added into acc[MP][NS] (shared, zeroed by the caller). NS is a multiple of 8.
template <int NS>
__device__ void product(const ARows& a, const int8_t* __restrict__ w, int n0, int k, int* acc) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int mt = (a.m + 15) / 16;
    int mwarps = mt < 8 ? mt : 8, ksplit = 8 / mwarps;
    if (warp >= mwarps * ksplit) return;
    int my_m = warp % mwarps, my_k = warp / mwarps;
    int ksteps = k / 32, per = (ksteps + ksplit - 1) / ksplit;
    int kb = my_k * per * 32, ke = min(k, kb + per * 32);
    for (int tile = my_m; tile < mt; tile += mwarps) {
        int r0 = tile * 16 + g, r1 = r0 + 8;
        int d[NS / 8][4];
#pragma unroll
        for (int j = 0; j < NS / 8; ++j) d[j][0] = d[j][1] = d[j][2] = d[j][3] = 0;
        // U k32 steps' loads issued before their products: each load is an L2 round trip
        // (~0.15 us), one step at a time would leave the warp waiting on every one.
        constexpr int U = NS <= 32 ? 8 : 2;
        for (int k0 = kb; k0 < ke; k0 += 32 * U) {
            unsigned af[U][4], bf[U][NS / 8][2];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                int kk = k0 + 32 * u;
                bool in = kk < ke;
                af[u][0] = in ? a.at(r0, kk + 4 * t) : 0u;
                af[u][1] = in ? a.at(r1, kk + 4 * t) : 0u;
                af[u][2] = in ? a.at(r0, kk + 16 + 4 * t) : 0u;
                af[u][3] = in ? a.at(r1, kk + 16 + 4 * t) : 0u;
#pragma unroll
                for (int j = 0; j < NS / 8; ++j) {
                    const int8_t* wr = w + (long long)(n0 + 8 * j + g) * k + kk + 4 * t;
                    bf[u][j][0] = in ? __ldg((const unsigned*)wr) : 0u;
                    bf[u][j][1] = in ? __ldg((const unsigned*)(wr + 16)) : 0u;
                }
            }
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int j = 0; j < NS / 8; ++j) mma(d[j], af[u], bf[u][j][0], bf[u][j][1]);
        }
#pragma unroll
        for (int j = 0; j < NS / 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int row = tile * 16 + g + (e >> 1) * 8, col = 8 * j + 2 * t + (e & 1);
                if (row < a.m) atomicAdd(acc + row * NS + col, d[j][e]);
            }
    }
}

// acc[MP][NS] -> bytes: into `out` (shared, [m][NS]) or, for the last stage, into y with the
// skip added. Zeroes acc for the next stage.
template <int NS>
__device__ void epilogue(const Block& b, const Stage& s, int n0, int* acc, int8_t* out, bool last) {
    for (int i = threadIdx.x; i < b.m * NS; i += THREADS) {
        int row = i / NS, col = i - row * NS, n = n0 + col;
        int8_t r = last ? b.x[(long long)row * b.c + n] : 0;
        signed char v = sat8(epi(acc[i], s.scale[n], s.bias[n], last, r, b.rs, b.inv_ys));
        if (last) b.y[(long long)row * b.c + n] = v;
        else out[i] = v;
        acc[i] = 0;
    }
}

// Every CTA's slice ([m][NS] at `slice` in each CTA) into full[m][NS * CL] here.
template <int NS>
__device__ void gather(const int8_t* slice, int8_t* full, int m) {
    const int chunks = NS / 16;  // 16-byte pieces of a slice's row
    for (int i = threadIdx.x; i < CL * m * chunks; i += THREADS) {
        int rank = i / (m * chunks), rest = i - rank * m * chunks, row = rest / chunks, ch = rest - row * chunks;
        uint4 v = ld_peer16(slice + row * NS + ch * 16, rank);
        *(uint4*)(full + row * NS * CL + rank * NS + ch * 16) = v;
    }
}

// P = 16 * S (S = P / CL: 16 for layer3, 32 for layer4); C = 4P. Launched as one cluster of
// CL CTAs (launch_block: 16 is a non-portable cluster size, opted into at run time).
template <int S>
__global__ void __launch_bounds__(THREADS) block_fused(Block b) {
    constexpr int S3 = 4 * S;  // stage 3's slice: C / CL
    extern __shared__ __align__(16) unsigned char smem[];
    int mp = (b.m + 15) / 16 * 16;
    int* acc = (int*)smem;                                  // [mp][S3] int32
    int8_t* slice = (int8_t*)(acc + mp * S3);               // [mp][S] this CTA's stage output
    int8_t* full = slice + mp * S;                          // [mp][P] every CTA's
    unsigned rank = cluster_rank();
    for (int i = threadIdx.x; i < mp * S3; i += THREADS) acc[i] = 0;
    __syncthreads();
    // Stage 1: 1x1, K = C, from the block's input in global memory.
    ARows a1{b.x, b.c, b.m, b.h, b.w, false};
    product<S>(a1, b.s[0].w, rank * S, b.c, acc);
    __syncthreads();
    epilogue<S>(b, b.s[0], rank * S, acc, slice, false);
    cluster_sync();
    gather<S>(slice, full, b.m);
    // Every peer has read this CTA's slice before it is written again.
    cluster_sync();
    // Stage 2: 3x3, K = 9P, from `full`.
    ARows a2{full, b.p, b.m, b.h, b.w, true};
    product<S>(a2, b.s[1].w, rank * S, 9 * b.p, acc);
    __syncthreads();
    epilogue<S>(b, b.s[1], rank * S, acc, slice, false);
    cluster_sync();
    gather<S>(slice, full, b.m);
    cluster_sync();
    // Stage 3: 1x1, K = P, from `full`, the skip added, into y.
    ARows a3{full, b.p, b.m, b.h, b.w, false};
    product<S3>(a3, b.s[2].w, rank * S3, b.p, acc);
    __syncthreads();
    epilogue<S3>(b, b.s[2], rank * S3, acc, nullptr, true);
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
    size_t smem = (size_t)mp * 4 * S * 4 + (size_t)mp * S + (size_t)mp * p;
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
    auto launch_block = [&]() {
        cudaLaunchConfig_t cfg{};
        cfg.gridDim = dim3(CL); cfg.blockDim = dim3(THREADS); cfg.dynamicSmemBytes = smem; cfg.stream = st;
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = CL; at[0].val.clusterDim.y = 1; at[0].val.clusterDim.z = 1;
        cfg.attrs = at; cfg.numAttrs = 1;
        CK(cudaLaunchKernelEx(&cfg, block_fused<S>, b));
    };
    launch_block();
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
    for (int r = 0; r < reps; ++r) launch_block();
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
}

int main() {
    run<16>(14);  // layer3's identity block
    run<32>(7);   // layer4's
    return 0;
}
