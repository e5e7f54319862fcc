"""What int8 buys on this GPU outside isolane: resnet50's 1x1 convolutions at batch 64 as GEMMs.

An anchor for issue 33's batch-64 target (int8 >= 1.6x fp16's throughput), run on the GPU
machine with its own PyTorch and Triton (session 38):

    python3 bench/persistent_int8/gemm_anchor.py

For each 1x1 shape (M = 64 * H * W pixels, K input channels, N output channels) it times, in
CUDA graphs of 20 copies, median of 20 replays:
  - fp16: torch.matmul (cuBLAS), fp16 out, the float engines' form;
  - int8 cuBLASLt: torch._int_mm, int32 out (PyTorch's only int8 GEMM);
  - int8 Triton: tl.dot on int8 with int32 sums, requantized to int8 in the epilogue
    (per-column scale), the form an int8 engine needs; the best of a few tile shapes.
Prints one line a shape with each time (us) and the fp16 / int8 ratios.
"""
import torch
import triton
import triton.language as tl


@triton.jit
def gemm_i8(a, b, s, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GM: tl.constexpr):
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    # Grouped order: GM row tiles share their B columns in L2.
    group = pid // (GM * tiles_n)
    first = group * GM
    rows = min(tiles_m - first, GM)
    pm = first + (pid % rows)
    pn = (pid % (GM * tiles_n)) // rows
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.int32)
    for k in range(0, K, BK):
        x = tl.load(a + rm[:, None] * K + (k + rk)[None, :], mask=rm[:, None] < M, other=0)
        w = tl.load(b + rn[None, :] * K + (k + rk)[:, None], mask=rn[None, :] < N, other=0)
        acc += tl.dot(x, w)
    scale = tl.load(s + rn, mask=rn < N, other=0.0)
    y = acc.to(tl.float32) * scale[None, :]
    y = tl.minimum(tl.maximum(y, -128.0), 127.0)
    y = tl.extra.cuda.libdevice.rint(y)
    tl.store(c + rm[:, None] * N + rn[None, :], y.to(tl.int8), mask=(rm[:, None] < M) & (rn[None, :] < N))


def graph_time(fn, copies=20, replays=20):
    fn()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(copies):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3 / copies)
    return sorted(times)[len(times) // 2]


def main():
    torch.manual_seed(0)
    shapes = []
    for hw, c_in, mid in [(56, 256, 64), (28, 512, 128), (14, 1024, 256), (7, 2048, 512)]:
        m = 64 * hw * hw
        shapes += [(m, c_in, mid), (m, mid, c_in)]  # a block's reduction and its expansion
    configs = [(128, 128, 64, 4, 3), (128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4)]
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    print("# M K N | fp16 cuBLAS us | int8 _int_mm (int32 out) us | int8 Triton (int8 out) us [tile] | fp16/int8 ratios")
    for m, k, n in shapes:
        a16 = torch.randn(m, k, device="cuda", dtype=torch.float16)
        b16 = torch.randn(k, n, device="cuda", dtype=torch.float16)
        a8 = torch.randint(-128, 127, (m, k), device="cuda", dtype=torch.int8)
        b8 = torch.randint(-128, 127, (n, k), device="cuda", dtype=torch.int8)
        s = torch.rand(n, device="cuda") * 1e-3
        c8 = torch.empty(m, n, device="cuda", dtype=torch.int8)
        t16 = graph_time(lambda: torch.matmul(a16, b16))
        try:
            b8t = b8.t()
            ti = graph_time(lambda: torch._int_mm(a8, b8t))
        except RuntimeError as e:
            ti = float("nan")
            print("  _int_mm:", str(e)[:120])
        best = (float("inf"), None)
        for bm, bn, bk, warps, stages in configs:
            if k % bk:
                continue
            grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)

            def run():
                gemm_i8[grid](a8, b8, s, c8, m, n, k, BM=bm, BN=bn, BK=bk, GM=8, num_warps=warps, num_stages=stages)

            try:
                t = graph_time(run)
            except Exception as e:  # a tile shape that does not fit: the next one
                print("  triton", (bm, bn, bk), str(e)[:100])
                continue
            best = min(best, (t, (bm, bn, bk, warps, stages)))
        # The Triton kernel's bytes against an exact reference, once a shape.
        exact = (a8.double() @ b8.double().t()).float()  # int32 sums, exact in f64, rounded to f32 as the kernel's cast
        ref = torch.clamp(torch.round(exact * s), -128, 127).to(torch.int8)
        bm, bn, bk, warps, stages = best[1]
        grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
        gemm_i8[grid](a8, b8, s, c8, m, n, k, BM=bm, BN=bn, BK=bk, GM=8, num_warps=warps, num_stages=stages)
        bad = (c8 != ref).float().mean().item()
        print(f"{m} {k} {n} | {t16:.1f} | {ti:.1f} | {best[0]:.1f} {best[1]} | "
              f"{t16 / ti:.2f}x {t16 / best[0]:.2f}x | bytes differing from fp32 reference {bad:.2e}")


if __name__ == "__main__":
    main()
