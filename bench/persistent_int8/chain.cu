// A feasibility study for issue 33's batch-1 int8 target (resnet50 <= 0.25 ms a job): do
// resnet50's 52 int8 convolutions run faster as ONE persistent kernel (a grid barrier between
// layers) than as one kernel a layer? Standalone: nvcc -O3 -gencode=arch=compute_90a,code=sm_90a
// chain.cu -o chain && ./chain [batch]. Not part of the engine; results in
// results/h200-engine4/session37-persistent-chain-and-input-passes.md.
//
// Each layer is an int8 implicit-GEMM convolution, NHWC: M = batch * OH * OW output pixels,
// N output channels, K = kh * kw * C (C a multiple of 16, so a 16-byte chunk of a row of A is one
// tap's channels). 64 x 64 tiles, 4 warps of 32 x 32, mma.sync m16n8k32 (s8 x s8 -> s32, exact).
// Few tiles (batch 1, layer4: M = 49) are split over K; the int32 partial sums are added into a
// scratch buffer with red.global.add (exact: integers, so the order cannot change the sum),
// and the block that finishes a tile last runs its epilogue and clears the scratch.
// Epilogue: y = sat(rint((acc * scale[n] + bias[n] + res * rs) / ys)), ReLU.
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cmath>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)

struct Conv {
    const int8_t* x; const int8_t* w; int8_t* y; const int8_t* res;
    const float* scale; const float* bias; int* acc; int* cnt;
    int b, h, wd, c, oh, ow, n, kh, kw, s, p, m, k;
    int tiles_m, tiles_n, splits, kchunk, items, relu;
    float rs, inv_ys;
};
// A stage: up to two independent convolutions (a block's first 1x1 and its downsample read
// the same input), their work items numbered one after the other.
struct Stage { int conv0, nconv, items; };

#define BM 64
#define BN 64
#define BK 64
#define LDS 80   // a row of a tile in shared memory: 64 bytes + 16 (ldmatrix rows on distinct banks)
#define MAXC 64
#define MAXS 64
__constant__ Conv g_convs[MAXC];
__constant__ Stage g_stages[MAXS];
// Measuring aid: bit 1 skips the loads, 2 the products, 4 the epilogue (wrong results).
__device__ int g_mode;

__device__ __forceinline__ void cp16(unsigned dst, const void* src, bool in) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(in ? 16 : 0));
}
__device__ __forceinline__ void ldsm4(unsigned a, unsigned* r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void mma(int* d, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One K step's A and B tiles into shared memory (2 chunks of 16 bytes a thread each).
__device__ __forceinline__ void load_tiles(const Conv& cv, unsigned sa, unsigned sb, int m0, int n0, int k0) {
#pragma unroll
    for (int u = 0; u < 2; ++u) {
        int chunk = threadIdx.x + u * 128, r = chunk >> 2, q = (chunk & 3) * 16;
        int k = k0 + q;
        // A: output pixel m0 + r, the tap and channels of k.
        int m = m0 + r;
        int tap = k / cv.c, ch = k - tap * cv.c, ky = tap / cv.kw, kx = tap - ky * cv.kw;
        int ox = m % cv.ow, t = m / cv.ow, oy = t % cv.oh, img = t / cv.oh;
        int iy = oy * cv.s - cv.p + ky, ix = ox * cv.s - cv.p + kx;
        bool in = m < cv.m && k < cv.k && iy >= 0 && iy < cv.h && ix >= 0 && ix < cv.wd;
        const int8_t* src = in ? cv.x + (((long long)img * cv.h + iy) * cv.wd + ix) * cv.c + ch : cv.x;
        cp16(sa + r * LDS + q, src, in);
        // B: weights row n0 + r ([N][K], K-contiguous).
        int n = n0 + r;
        bool inb = n < cv.n && k < cv.k;
        cp16(sb + r * LDS + q, inb ? cv.w + (long long)n * cv.k + k : cv.w, inb);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
}

__device__ __forceinline__ signed char sat8(float v) {
    float r = rintf(v);
    r = fminf(fmaxf(r, -128.f), 127.f);
    return (signed char)(int)r;
}
__device__ __forceinline__ float epi(const Conv& cv, int acc, int m, int n) {
    float v = __fadd_rn(__fmul_rn((float)acc, cv.scale[n]), cv.bias[n]);
    if (cv.res) v = __fadd_rn(v, __fmul_rn((float)cv.res[(long long)m * cv.n + n], cv.rs));
    if (cv.relu) v = fmaxf(v, 0.f);
    return __fmul_rn(v, cv.inv_ys);
}

// One work item: tile (tm, tn), K split sk.
__device__ void run_item(const Conv& cv, int item, unsigned smem, int* flag) {
    int tile = item / cv.splits, sk = item - tile * cv.splits;
    int tm = tile / cv.tiles_n, tn = tile - tm * cv.tiles_n;
    int m0 = tm * BM, n0 = tn * BN;
    int kb = sk * cv.kchunk, ke = min(cv.k, kb + cv.kchunk);
    int steps = (ke - kb + BK - 1) / BK;
    const unsigned TILE = BM * LDS;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
    int d[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) d[i][j][0] = d[i][j][1] = d[i][j][2] = d[i][j][3] = 0;
    // The K loop may end past ke inside its last step: load_tiles zero-fills k >= cv.k only, so
    // a split's chunk is a multiple of BK (host) and only the last split ends at K.
    int mode = g_mode;
    if (!(mode & 1)) load_tiles(cv, smem, smem + TILE, m0, n0, kb);
    for (int s = 0; s < steps; ++s) {
        unsigned cur = smem + (s & 1) * 2 * TILE;
        if (s + 1 < steps && !(mode & 1)) {
            unsigned nxt = smem + ((s + 1) & 1) * 2 * TILE;
            load_tiles(cv, nxt, nxt + TILE, m0, n0, kb + (s + 1) * BK);
            asm volatile("cp.async.wait_group 1;" ::: "memory");
        } else {
            asm volatile("cp.async.wait_group 0;" ::: "memory");
        }
        __syncthreads();
        unsigned sa = cur, sb = cur + TILE;
        if (!(mode & 2))
#pragma unroll
        for (int kk = 0; kk < BK; kk += 32) {
            unsigned a[2][4], b[2][4];
            // ldmatrix x4: lanes 0-15 address rows 0-15 at byte kk, lanes 16-31 rows 0-15 at kk + 16.
#pragma unroll
            for (int i = 0; i < 2; ++i)
                ldsm4(sa + (wm + i * 16 + (lane & 15)) * LDS + kk + (lane >> 4) * 16, a[i]);
            // B: matrices (rows n 0-7, k 0-15), (n 0-7, k 16-31), (n 8-15, k 0-15), (n 8-15, k 16-31).
#pragma unroll
            for (int j = 0; j < 2; ++j)
                ldsm4(sb + (wn + j * 16 + (lane & 7) + ((lane >> 4) << 3)) * LDS + kk + ((lane >> 3) & 1) * 16, b[j]);
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) mma(d[i][j], a[i], b[j >> 1][(j & 1) * 2], b[j >> 1][(j & 1) * 2 + 1]);
        }
        __syncthreads();
    }
    int g = lane >> 2, t4 = lane & 3;
    if (mode & 4) { if (d[0][0][0] == 12345 && d[1][3][3] == 777) cv.y[0] = 1; return; }
    if (cv.splits > 1) {
        // Add this split's sums into the tile's scratch; the last block to arrive finishes it.
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    int m = m0 + wm + i * 16 + g + (e >> 1) * 8, n = n0 + wn + j * 8 + 2 * t4 + (e & 1);
                    if (m < cv.m && n < cv.n) atomicAdd(cv.acc + (long long)m * cv.n + n, d[i][j][e]);
                }
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) *flag = atomicAdd(cv.cnt + tile, 1) == cv.splits - 1;
        __syncthreads();
        if (!*flag) return;
        __threadfence();
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    int m = m0 + wm + i * 16 + g + (e >> 1) * 8, n = n0 + wn + j * 8 + 2 * t4 + (e & 1);
                    if (m < cv.m && n < cv.n) {
                        int* p = cv.acc + (long long)m * cv.n + n;
                        d[i][j][e] = __ldcg(p);
                        *p = 0;
                    }
                }
        if (threadIdx.x == 0) cv.cnt[tile] = 0;
    }
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                int m = m0 + wm + i * 16 + g + h * 8, n = n0 + wn + j * 8 + 2 * t4;
                if (m >= cv.m || n >= cv.n) continue;
                signed char y0 = sat8(epi(cv, d[i][j][2 * h], m, n)), y1 = sat8(epi(cv, d[i][j][2 * h + 1], m, n + 1));
                *(short*)(cv.y + (long long)m * cv.n + n) = (short)((unsigned char)y0 | ((unsigned)(unsigned char)y1 << 8));
            }
}

// A grid barrier: the last block to arrive bumps the generation the others spin on.
__device__ __forceinline__ void grid_sync(unsigned* bar) {
    __syncthreads();
    if (threadIdx.x == 0) {
        volatile unsigned* gen = bar + 1;
        unsigned my = *gen;
        __threadfence();
        if (atomicAdd(bar, 1) == gridDim.x - 1) {
            bar[0] = 0;
            __threadfence();
            atomicAdd(bar + 1, 1);
        } else {
            while (*gen == my) __nanosleep(32);
        }
        __threadfence();
    }
    __syncthreads();
}

__device__ void run_stage(int si, unsigned smem, int* flag) {
    Stage st = g_stages[si];
    for (int it = blockIdx.x; it < st.items; it += gridDim.x) {
        int c = st.conv0, local = it;
        if (st.nconv > 1 && local >= g_convs[c].items) { local -= g_convs[c].items; ++c; }
        run_item(g_convs[c], local, smem, flag);
    }
}

extern "C" __global__ void __launch_bounds__(128) chain_persistent(int s0, int s1, unsigned* bar) {
    extern __shared__ __align__(128) unsigned char sm[];
    __shared__ int flag;
    unsigned smem = (unsigned)__cvta_generic_to_shared(sm);
    for (int s = s0; s < s1; ++s) {
        run_stage(s, smem, &flag);
        if (s + 1 < s1) grid_sync(bar);
    }
}

// The reference: one thread an output, the same float operations in the same order.
__global__ void conv_ref(Conv cv) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)cv.m * cv.n) return;
    int m = i / cv.n, n = i % cv.n;
    int ox = m % cv.ow, t = m / cv.ow, oy = t % cv.oh, img = t / cv.oh;
    int acc = 0;
    for (int ky = 0; ky < cv.kh; ++ky)
        for (int kx = 0; kx < cv.kw; ++kx) {
            int iy = oy * cv.s - cv.p + ky, ix = ox * cv.s - cv.p + kx;
            if (iy < 0 || iy >= cv.h || ix < 0 || ix >= cv.wd) continue;
            const int8_t* xp = cv.x + (((long long)img * cv.h + iy) * cv.wd + ix) * cv.c;
            const int8_t* wp = cv.w + (long long)n * cv.k + (ky * cv.kw + kx) * cv.c;
            for (int ch = 0; ch < cv.c; ++ch) acc += (int)xp[ch] * (int)wp[ch];
        }
    cv.y[i] = sat8(epi(cv, acc, m, n));
}

// ---------------------------------------------------------------------------------------------
struct Host {
    std::vector<Conv> convs;
    std::vector<Stage> stages;
    std::vector<void*> allocs;
    int* acc = nullptr;
    int* cnt = nullptr;
    int sms = 132;
    template <typename T> T* alloc(size_t n) { void* p; CK(cudaMalloc(&p, n * sizeof(T))); allocs.push_back(p); return (T*)p; }
};

static uint32_t rng = 12345;
static int rnd(int lo, int hi) { rng = rng * 1664525u + 1013904223u; return lo + (int)((rng >> 8) % (uint32_t)(hi - lo + 1)); }

// A conv reading x (b, h, w, c) int8 NHWC; returns its index; y allocated here.
static int add_conv(Host& H, const int8_t* x, int b, int h, int w, int c, int n, int ks, int s, const int8_t* res, int relu) {
    Conv cv{};
    cv.x = x; cv.b = b; cv.h = h; cv.wd = w; cv.c = c; cv.n = n; cv.kh = cv.kw = ks; cv.s = s; cv.p = ks / 2;
    cv.oh = (h + 2 * cv.p - ks) / s + 1; cv.ow = (w + 2 * cv.p - ks) / s + 1;
    cv.m = b * cv.oh * cv.ow; cv.k = ks * ks * c;
    std::vector<int8_t> wh((size_t)n * cv.k);
    for (auto& v : wh) v = (int8_t)rnd(-20, 20);
    int8_t* wd = H.alloc<int8_t>(wh.size());
    CK(cudaMemcpy(wd, wh.data(), wh.size(), cudaMemcpyHostToDevice));
    cv.w = wd;
    std::vector<float> sc(n), bi(n);
    // acc ~ N(0, sqrt(K) * 40 * 12): scale it to ~ N(0, 1) before /ys.
    float base = 1.f / (std::sqrt((float)cv.k) * 40.f * 12.f);
    for (int i = 0; i < n; ++i) { sc[i] = base * (0.5f + rnd(0, 100) / 100.f); bi[i] = (rnd(0, 200) - 100) / 400.f; }
    float* scd = H.alloc<float>(n); float* bid = H.alloc<float>(n);
    CK(cudaMemcpy(scd, sc.data(), n * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(bid, bi.data(), n * 4, cudaMemcpyHostToDevice));
    cv.scale = scd; cv.bias = bid; cv.res = res; cv.rs = 1.f / 40.f; cv.relu = relu; cv.inv_ys = 40.f;
    cv.y = H.alloc<int8_t>((size_t)cv.m * n);
    cv.tiles_m = (cv.m + BM - 1) / BM; cv.tiles_n = (n + BN - 1) / BN;
    int tiles = cv.tiles_m * cv.tiles_n, ksteps = (cv.k + BK - 1) / BK;
    // Split K until the items fill the GPU, each split at least 2 K steps.
    int splits = 1;
    while (tiles * splits * 2 <= H.sms && ksteps / (splits * 2) >= 2) splits *= 2;
    int per = (ksteps + splits - 1) / splits;
    cv.splits = (ksteps + per - 1) / per;
    cv.kchunk = per * BK;
    cv.items = tiles * cv.splits;
    H.convs.push_back(cv);
    return (int)H.convs.size() - 1;
}

static void build_resnet50(Host& H, int b) {
    int8_t* x = H.alloc<int8_t>((size_t)b * 56 * 56 * 64);
    std::vector<int8_t> xh((size_t)b * 56 * 56 * 64);
    for (auto& v : xh) v = (int8_t)rnd(0, 80);
    CK(cudaMemcpy(x, xh.data(), xh.size(), cudaMemcpyHostToDevice));
    const int8_t* cur = x;
    int h = 56, c = 64;
    int blocks[4] = {3, 4, 6, 3}, planes[4] = {64, 128, 256, 512};
    for (int L = 0; L < 4; ++L)
        for (int bl = 0; bl < blocks[L]; ++bl) {
            int p = planes[L], s = (bl == 0 && L > 0) ? 2 : 1, out = p * 4;
            int c1 = add_conv(H, cur, b, h, h, c, p, 1, 1, nullptr, 1);
            const int8_t* res = cur;
            int ds = -1;
            if (bl == 0) ds = add_conv(H, cur, b, h, h, c, out, 1, s, nullptr, 0);
            Stage st{c1, ds >= 0 ? 2 : 1, 0};
            st.items = H.convs[c1].items + (ds >= 0 ? H.convs[ds].items : 0);
            H.stages.push_back(st);
            if (ds >= 0) res = H.convs[ds].y;
            int c2 = add_conv(H, H.convs[c1].y, b, h, h, p, p, 3, s, nullptr, 1);
            H.stages.push_back(Stage{c2, 1, H.convs[c2].items});
            int oh = H.convs[c2].oh;
            int c3 = add_conv(H, H.convs[c2].y, b, oh, oh, p, out, 1, 1, res, 1);
            H.stages.push_back(Stage{c3, 1, H.convs[c3].items});
            cur = H.convs[c3].y; h = oh; c = out;
        }
    // Each split conv gets its own counters and scratch (two of a stage may run at once).
    for (auto& cv : H.convs)
        if (cv.splits > 1) {
            cv.acc = H.alloc<int>((size_t)cv.m * cv.n);
            CK(cudaMemset(cv.acc, 0, (size_t)cv.m * cv.n * 4));
            cv.cnt = H.alloc<int>(cv.tiles_m * cv.tiles_n);
            CK(cudaMemset(cv.cnt, 0, cv.tiles_m * cv.tiles_n * 4));
        }
    CK(cudaMemcpyToSymbol(g_convs, H.convs.data(), H.convs.size() * sizeof(Conv)));
    CK(cudaMemcpyToSymbol(g_stages, H.stages.data(), H.stages.size() * sizeof(Stage)));
}

static float median(std::vector<float> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

int main(int argc, char** argv) {
    int b = argc > 1 ? atoi(argv[1]) : 1;
    cudaDeviceProp prop; CK(cudaGetDeviceProperties(&prop, 0));
    Host H; H.sms = prop.multiProcessorCount;
    build_resnet50(H, b);
    int ns = (int)H.stages.size();
    size_t smem = 4 * BM * LDS;
    CK(cudaFuncSetAttribute(chain_persistent, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    unsigned* bar; CK(cudaMalloc(&bar, 8)); CK(cudaMemset(bar, 0, 8));
    int occ = 0; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, chain_persistent, 128, smem));
    printf("batch %d: %zu convs in %d stages, %d SMs, %d blocks/SM possible\n", b, H.convs.size(), ns, H.sms, occ);
    long long macs = 0; int items = 0;
    for (auto& cv : H.convs) { macs += (long long)cv.m * cv.n * cv.k; items += cv.items; }
    printf("%.2f GMAC; work items %d\n", macs / 1e9, items);
    cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));

    // Reference outputs of every conv (on the persistent chain's own inputs: each conv's input is
    // the previous conv's reference output, so compare conv by conv after a full reference run).
    std::vector<std::vector<int8_t>> ref(H.convs.size());
    for (size_t i = 0; i < H.convs.size(); ++i) {
        Conv cv = H.convs[i];
        long long n = (long long)cv.m * cv.n;
        conv_ref<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(cv);
    }
    CK(cudaStreamSynchronize(st));
    for (size_t i = 0; i < H.convs.size(); ++i) {
        ref[i].resize((size_t)H.convs[i].m * H.convs[i].n);
        CK(cudaMemcpy(ref[i].data(), H.convs[i].y, ref[i].size(), cudaMemcpyDeviceToHost));
        CK(cudaMemset(H.convs[i].y, 0x55, ref[i].size()));
    }
    auto check = [&](const char* what) {
        long long bad = 0, zeros = 0, total = 0;
        for (size_t i = 0; i < H.convs.size(); ++i) {
            std::vector<int8_t> got(ref[i].size());
            CK(cudaMemcpy(got.data(), H.convs[i].y, got.size(), cudaMemcpyDeviceToHost));
            for (size_t j = 0; j < got.size(); ++j) { bad += got[j] != ref[i][j]; zeros += ref[i][j] == 0; }
            total += got.size();
        }
        printf("%s: %lld of %lld bytes differ from the reference (%.1f%% of the reference's bytes are 0)\n", what, bad, total, 100.0 * zeros / total);
    };

    std::vector<int> grids = {H.sms, 2 * H.sms};
    for (int grid : grids) {
        if (grid > occ * H.sms) continue;
        for (int i = 0; i < 5; ++i) chain_persistent<<<grid, 128, smem, st>>>(0, ns, bar);
        CK(cudaStreamSynchronize(st));
        char what[64]; snprintf(what, sizeof what, "persistent, grid %d", grid);
        check(what);
        std::vector<float> t;
        for (int r = 0; r < 200; ++r) {
            CK(cudaEventRecord(e0, st));
            chain_persistent<<<grid, 128, smem, st>>>(0, ns, bar);
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); t.push_back(ms);
        }
        printf("  persistent, grid %d: median %.1f us (min %.1f)\n", grid, 1e3 * median(t), 1e3 * *std::min_element(t.begin(), t.end()));
    }
    // One kernel a stage, captured in a CUDA graph (the engine's form), with and without
    // programmatic dependent launch (no griddepcontrol in the kernel, so it only lets the next
    // launch be processed early).
    for (int pdl = 0; pdl < 2; ++pdl) {
        cudaGraph_t g; cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        for (int s = 0; s < ns; ++s) {
            int items = H.stages[s].items, grid = std::min(items, 4 * H.sms);
            cudaLaunchConfig_t cfg{}; cfg.gridDim = grid; cfg.blockDim = 128; cfg.dynamicSmemBytes = smem; cfg.stream = st;
            cudaLaunchAttribute at[1]; at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization; at[0].val.programmaticStreamSerializationAllowed = 1;
            cfg.attrs = at; cfg.numAttrs = pdl ? 1 : 0;
            CK(cudaLaunchKernelEx(&cfg, chain_persistent, s, s + 1, bar));
        }
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        for (int i = 0; i < 5; ++i) CK(cudaGraphLaunch(ge, st));
        CK(cudaStreamSynchronize(st));
        check(pdl ? "a kernel a stage, PDL" : "a kernel a stage");
        std::vector<float> t;
        for (int r = 0; r < 200; ++r) {
            CK(cudaEventRecord(e0, st));
            CK(cudaGraphLaunch(ge, st));
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); t.push_back(ms);
        }
        printf("  a kernel a stage (graph%s): median %.1f us\n", pdl ? ", PDL" : "", 1e3 * median(t));
    }
    // The barrier alone: 48 stages of no work.
    {
        std::vector<Stage> empty(ns, Stage{0, 1, 0});
        CK(cudaMemcpyToSymbol(g_stages, empty.data(), empty.size() * sizeof(Stage)));
        std::vector<float> t;
        for (int r = 0; r < 200; ++r) {
            CK(cudaEventRecord(e0, st));
            chain_persistent<<<H.sms, 128, smem, st>>>(0, ns, bar);
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); t.push_back(ms);
        }
        printf("  %d barriers, no work: median %.1f us\n", ns - 1, 1e3 * median(t));
        CK(cudaMemcpyToSymbol(g_stages, H.stages.data(), H.stages.size() * sizeof(Stage)));
    }
    auto graph_time = [&](int s, int reps, int mode) {
        CK(cudaMemcpyToSymbol(g_mode, &mode, 4));
        cudaGraph_t g; cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        for (int r = 0; r < reps; ++r) {
            int items = s < 0 ? 1 : H.stages[s].items;
            chain_persistent<<<std::max(1, std::min(items, 4 * H.sms)), 128, smem, st>>>(s < 0 ? 0 : s, s < 0 ? 0 : s + 1, bar);
        }
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, st));
        std::vector<float> t;
        for (int r = 0; r < 30; ++r) {
            CK(cudaEventRecord(e0, st)); CK(cudaGraphLaunch(ge, st)); CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); t.push_back(ms);
        }
        CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(g));
        int z = 0; CK(cudaMemcpyToSymbol(g_mode, &z, 4));
        return 1e3 * median(t) / reps;
    };
    printf("  an empty kernel in a graph of 48: %.2f us each\n", graph_time(-1, 48, 0));
    printf("  stage  M x N x K  splits items  us: all, no loads, no products, no epilogue, none (graph of 16 copies)\n");
    for (int s = 0; s < ns; ++s) {
        const Conv& cv = H.convs[H.stages[s].conv0];
        printf("  %5d  %5d x %4d x %4d  %2d  %5d  %.2f %.2f %.2f %.2f %.2f\n", s, cv.m, cv.n, cv.k, cv.splits, H.stages[s].items,
               graph_time(s, 16, 0), graph_time(s, 16, 1), graph_time(s, 16, 2), graph_time(s, 16, 4), graph_time(s, 16, 7));
    }
    return 0;
}
