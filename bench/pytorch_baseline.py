#!/usr/bin/env python3
"""PyTorch baseline for `isolane bench`: the same models, batches and precisions, measured the
same way, in PyTorch's configurations a user tunes: eager, CUDA graphs in NCHW, CUDA graphs in
channels_last, and (--compile) torch.compile.

A job is what an isolane workload runs: copy the float32 input from pinned host memory to the
GPU (cast to the model's dtype there), forward, copy the float32 output back to pinned host
memory, wait (torch.cuda.synchronize). Each job is timed with a host clock; median and p99 over
--replays jobs after --warmup untimed ones.

TF32: fp32 runs with torch.backends.cuda.matmul.allow_tf32 = False and
torch.backends.cudnn.allow_tf32 = False (true fp32); tf32 runs with both True. fp16 / bf16 run
the model converted with .half() / .bfloat16(). cudnn.benchmark = True.

Configurations, each a column (median ms per job):
  eager       NCHW (PyTorch's default), no graph;
  graphs      NCHW, the forward captured in one CUDA graph (PyTorch's documented recipe);
  graphs_cl   channels_last: the model converted with .to(memory_format=torch.channels_last),
              the input converted inside the captured graph (part of every job, as a user's
              channels_last pipeline does it);
  compile     (--compile MODE, e.g. reduce-overhead or max-autotune; off by default: building
              takes tens of seconds to minutes per model) torch.compile of the NCHW model;
              its build time is reported as compile_s.
`best` is the fastest of graphs, graphs_cl and compile; the ratio compares it with isolane.

    python3 bench/pytorch_baseline.py --models resnet18,vit_b_16 --batch 1 --precisions fp16,tf32
    python3 bench/pytorch_baseline.py ... --ours ours.jsonl     # + isolane's numbers and ratios

`--ours` reads the JSON lines printed by `isolane bench --json` and prints one table with
isolane, each PyTorch configuration, the best one and the ratio (PyTorch best / isolane: > 1
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


def timed(job, batch, replays, warmup):
    """`job` run `warmup` times untimed, then `replays` times, each timed with a host clock."""
    for _ in range(warmup):
        job()
    t = []
    w0 = time.perf_counter()
    for _ in range(replays):
        t0 = time.perf_counter()
        job()
        t.append((time.perf_counter() - t0) * 1e3)
    return stats(t, batch, time.perf_counter() - w0)


def graph_of(forward):
    """`forward()` captured in a CUDA graph (warmed up on a side stream first, as PyTorch
    documents); returns the graph and its static output."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            forward()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = forward()
    return g, out


def measure(name, batch, prec, replays, warmup, compile_mode=None):
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

    def job_of(forward):
        def job():
            static_in.copy_(host_in, non_blocking=True)
            y = forward()
            host_out.copy_(y, non_blocking=True)
            torch.cuda.synchronize()
        return job

    def replay_job(g, static_out):
        def replay():
            g.replay()
            return static_out
        return job_of(replay)

    with torch.inference_mode():
        res["eager"] = timed(job_of(lambda: model(static_in)), batch, replays, warmup)
        g, static_out = graph_of(lambda: model(static_in))
        res["graphs"] = timed(replay_job(g, static_out), batch, replays, warmup)
        del g, static_out
        if compile_mode:
            compiled = torch.compile(model, mode=compile_mode)
            t0 = time.perf_counter()
            job = job_of(lambda: compiled(static_in))
            job()  # the build
            compile_s = time.perf_counter() - t0
            res["compile"] = dict(timed(job, batch, replays, warmup), compile_s=compile_s,
                                  mode=compile_mode)
            del compiled
            torch._dynamo.reset()
        model = model.to(memory_format=torch.channels_last)
        g, static_out = graph_of(
            lambda: model(static_in.contiguous(memory_format=torch.channels_last)))
        res["graphs_cl"] = timed(replay_job(g, static_out), batch, replays, warmup)
        del g, static_out
    res["best"] = min((k for k in ("graphs", "graphs_cl", "compile") if k in res),
                      key=lambda k: res[k]["median_ms"])
    del model
    torch.cuda.empty_cache()
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="resnet18,resnet50,mobilenet_v2,convnext_base,convnext_large,vit_b_16,vit_l_32")
    ap.add_argument("--batch", default="1")
    ap.add_argument("--precisions", default="fp16,tf32")
    ap.add_argument("--replays", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--compile", metavar="MODE", default=None,
                    help="also measure torch.compile(model, mode=MODE), e.g. reduce-overhead")
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
                r = measure(name, batch, prec, a.replays, a.warmup, a.compile)
                rec = {"model": name, "batch": batch, "precision": prec, "replays": a.replays,
                       **r}
                if a.json:
                    print(json.dumps(rec), flush=True)
                rows.append(rec)
    if a.json:
        return
    dev = torch.cuda.get_device_name()
    print(f"# {dev}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}; "
          f"median of {a.replays} jobs (ms); ratio = PyTorch's best / isolane (> 1: isolane faster)")
    print(table(rows, ours))
    sys.stdout.flush()


def table(rows, ours):
    """The comparison table: isolane, each PyTorch configuration (median ms), the best one and
    the ratio best / isolane."""
    cols = ["eager", "graphs", "graphs_cl", "compile"]
    hdr = (f"{'model':<15} {'batch':>5} {'prec':<5} {'isolane':>9} "
           + " ".join(f"{c:>9}" for c in cols) + f" {'best':>9} {'ratio':>6}")
    lines = [hdr]
    for rec in rows:
        o = ours.get((rec["model"], rec["batch"], rec["precision"]))
        med = {c: rec[c]["median_ms"] for c in cols if c in rec}
        best = med[rec["best"]]
        cells = " ".join(f"{med[c]:>9.3f}" if c in med else f"{'-':>9}" for c in cols)
        om = f"{o['median_ms']:>9.3f}" if o else f"{'-':>9}"
        ratio = f"{best / o['median_ms']:>6.2f}" if o else f"{'-':>6}"
        lines.append(f"{rec['model']:<15} {rec['batch']:>5} {rec['precision']:<5} {om} {cells} "
                     f"{rec['best']:>9} {ratio}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
