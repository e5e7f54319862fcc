#!/usr/bin/env python3
"""PyTorch baseline for `isolane bench`: the same models, batches and precisions, measured the
same way, in PyTorch eager and PyTorch with CUDA graphs.

A job is what an isolane workload runs: copy the float32 input from pinned host memory to the
GPU (cast to the model's dtype there), forward, copy the float32 output back to pinned host
memory, wait (torch.cuda.synchronize). Each job is timed with a host clock; median and p99 over
--replays jobs after --warmup untimed ones.

TF32: fp32 runs with torch.backends.cuda.matmul.allow_tf32 = False and
torch.backends.cudnn.allow_tf32 = False (true fp32); tf32 runs with both True. fp16 / bf16 run
the model converted with .half() / .bfloat16(). cudnn.benchmark = True. Memory format: NCHW
(PyTorch's default).

    python3 bench/pytorch_baseline.py --models resnet18,vit_b_16 --batch 1 --precisions fp16,tf32
    python3 bench/pytorch_baseline.py ... --ours ours.jsonl     # + isolane's numbers and ratios

`--ours` reads the JSON lines printed by `isolane bench --json` and prints one table with
isolane, PyTorch eager, PyTorch + CUDA graphs and the ratios (PyTorch graphs / isolane: > 1
means isolane is faster).
"""

import argparse
import json
import sys
import time

import torch
import torchvision


# Input side per model (isolane's built-in architectures take the same sizes).
INPUT_SIZE = {"fcn_resnet50": 520}


class OutOnly(torch.nn.Module):
    """torchvision's segmentation models return a dict; isolane's returns the "out" tensor."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x):
        return self.m(x)["out"]


def build(name, dtype):
    if name.startswith("fcn_"):
        # No download: no pretrained backbone, no auxiliary head (as isolane's fcn_resnet50).
        seg = getattr(torchvision.models.segmentation, name)(weights=None, weights_backbone=None, aux_loss=False)
        m = OutOnly(seg)
    else:
        m = getattr(torchvision.models, name)(weights=None)
    m = m.eval().cuda()
    if dtype != torch.float32:
        m = m.to(dtype)
    return m


def stats(times, batch, wall):
    times = sorted(times)
    n = len(times)
    return {
        "median_ms": times[n // 2],
        "p99_ms": times[min(n - 1, round((n - 1) * 0.99))],
        "min_ms": times[0],
        "throughput_ips": n * batch / wall,
    }


def measure(name, batch, prec, replays, warmup):
    tf32 = prec == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = True
    dtype = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[prec]
    model = build(name, dtype)
    size = INPUT_SIZE.get(name, 224)
    host_in = torch.randn(batch, 3, size, size).pin_memory()
    static_in = torch.empty(batch, 3, size, size, device="cuda", dtype=dtype)
    with torch.inference_mode():
        out = model(static_in.copy_(host_in))
    host_out = torch.empty(out.shape, dtype=torch.float32).pin_memory()
    res = {}

    def job_eager():
        static_in.copy_(host_in, non_blocking=True)
        y = model(static_in)
        host_out.copy_(y, non_blocking=True)
        torch.cuda.synchronize()

    with torch.inference_mode():
        for _ in range(warmup):
            job_eager()
        t = []
        w0 = time.perf_counter()
        for _ in range(replays):
            t0 = time.perf_counter()
            job_eager()
            t.append((time.perf_counter() - t0) * 1e3)
        res["eager"] = stats(t, batch, time.perf_counter() - w0)

        # CUDA graph of the forward (warm-up on a side stream first, as PyTorch documents).
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                model(static_in)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_out = model(static_in)

        def job_graph():
            static_in.copy_(host_in, non_blocking=True)
            g.replay()
            host_out.copy_(static_out, non_blocking=True)
            torch.cuda.synchronize()

        for _ in range(warmup):
            job_graph()
        t = []
        w0 = time.perf_counter()
        for _ in range(replays):
            t0 = time.perf_counter()
            job_graph()
            t.append((time.perf_counter() - t0) * 1e3)
        res["graphs"] = stats(t, batch, time.perf_counter() - w0)
    del model, g
    torch.cuda.empty_cache()
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="resnet18,resnet50,mobilenet_v2,convnext_base,convnext_large,vit_b_16,vit_l_32")
    ap.add_argument("--batch", default="1")
    ap.add_argument("--precisions", default="fp16,tf32")
    ap.add_argument("--replays", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--json", action="store_true", help="print JSON lines only")
    ap.add_argument("--ours", help="JSON lines from `isolane bench --json` to compare against")
    a = ap.parse_args()
    ours = {}
    if a.ours:
        for line in open(a.ours):
            line = line.strip()
            if line.startswith("{"):
                r = json.loads(line)
                ours[(r["model"], r["batch"], r["precision"])] = r
    rows = []
    for name in a.models.split(","):
        for batch in [int(b) for b in a.batch.split(",")]:
            for prec in a.precisions.split(","):
                r = measure(name, batch, prec, a.replays, a.warmup)
                rec = {"model": name, "batch": batch, "precision": prec, "replays": a.replays,
                       "eager": r["eager"], "graphs": r["graphs"]}
                if a.json:
                    print(json.dumps(rec), flush=True)
                rows.append(rec)
    if a.json:
        return
    dev = torch.cuda.get_device_name()
    print(f"# {dev}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}; "
          f"median of {a.replays} jobs (ms); ratio = PyTorch graphs / isolane (> 1: isolane faster)")
    hdr = f"{'model':<15} {'batch':>5} {'prec':<5} {'isolane':>9} {'p99':>8} {'eager':>9} {'graphs':>9} {'p99':>8} {'ratio':>7} {'isolane img/s':>13} {'graphs img/s':>13}"
    print(hdr)
    for rec in rows:
        o = ours.get((rec["model"], rec["batch"], rec["precision"]))
        om = f"{o['median_ms']:.3f}" if o else "-"
        op = f"{o['p99_ms']:.3f}" if o else "-"
        ratio = f"{rec['graphs']['median_ms'] / o['median_ms']:.2f}" if o else "-"
        oi = f"{o['throughput_ips']:.0f}" if o else "-"
        print(f"{rec['model']:<15} {rec['batch']:>5} {rec['precision']:<5} {om:>9} {op:>8} "
              f"{rec['eager']['median_ms']:>9.3f} {rec['graphs']['median_ms']:>9.3f} {rec['graphs']['p99_ms']:>8.3f} "
              f"{ratio:>7} {oi:>13} {rec['graphs']['throughput_ips']:>13.0f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
