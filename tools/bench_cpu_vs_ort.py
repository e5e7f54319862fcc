#!/usr/bin/env python3
"""resnet18, batch 1: isolane's CPU backend against onnxruntime at the same thread count,
interleaved in one run so that both see the same machine load.

Each round runs isolane (`examples/cpu_bench`, built-in resnet18, a fresh process: median of
`--runs` calls of `run()` after warm-up) and then onnxruntime in this process (the same
torchvision architecture written with onnx.helper by crates/isolane-engine/bench/ort_resnet18.py,
BN folded, sequential execution, intra-op threads = T; median of `--runs` calls of
`session.run`). Prints every round's pair and the median over rounds, per thread count. At one
thread it also prints the median process CPU time per run of both, which time spent preempted
by other processes does not inflate (the wall times do); at two threads CPU time would count
the workers' spinning, so only wall time is meaningful there.

    cargo build --release -p isolane-engine --example cpu_bench
    python3 tools/bench_cpu_vs_ort.py [--threads 1 2] [--rounds 7] [--runs 60]
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

import numpy as np
import onnxruntime as ort

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ort_model_bytes():
    """The ORT resnet18 of the engine's baseline script, built without running its timing tail."""
    path = os.path.join(ROOT, "crates/isolane-engine/bench/ort_resnet18.py")
    src = open(path).read()
    head = src.split("threads = int(sys.argv[1])")[0]
    ns = {"__name__": "ort_resnet18"}
    exec(compile(head, path, "exec"), ns)
    return ns["model"].SerializeToString()


def median_ms(f, runs, warmup=5):
    """(median wall ms, median process CPU ms) per call."""
    for _ in range(warmup):
        f()
    ts, cs = [], []
    for _ in range(runs):
        t, c = time.perf_counter(), time.process_time()
        f()
        ts.append((time.perf_counter() - t) * 1e3)
        cs.append((time.process_time() - c) * 1e3)
    return statistics.median(ts), statistics.median(cs)


def isolane_ms(binary, threads, runs):
    out = subprocess.run([binary, "resnet18", "1", str(threads), str(runs)], check=True,
                         capture_output=True, text=True).stdout
    m = re.search(r"median ([0-9.]+) ms, p90 [0-9.]+ ms, cpu ([0-9.]+) ms", out)
    if not m:
        sys.exit(f"unexpected cpu_bench output: {out!r}")
    return float(m.group(1)), float(m.group(2))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/examples/cpu_bench"))
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--runs", type=int, default=60)
    a = ap.parse_args()
    model = ort_model_bytes()
    x = np.random.default_rng(0).normal(size=(1, 3, 224, 224)).astype(np.float32)
    print(f"onnxruntime {ort.__version__}; load average at start {os.getloadavg()}")
    for t in a.threads:
        so = ort.SessionOptions()
        so.intra_op_num_threads = t
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        ours, theirs, ours_cpu, theirs_cpu = [], [], [], []
        for r in range(a.rounds):
            wo, co = isolane_ms(a.bin, t, a.runs)
            wt, ct = median_ms(lambda: sess.run(None, {"input": x}), a.runs)
            ours.append(wo)
            theirs.append(wt)
            ours_cpu.append(co)
            theirs_cpu.append(ct)
            cpu = f"  (cpu {co:6.2f} vs {ct:6.2f} ms, ratio {co / ct:.2f})" if t == 1 else ""
            print(f"threads {t} round {r}: isolane {wo:6.2f} ms  onnxruntime {wt:6.2f} ms"
                  f"  ratio {wo / wt:.2f}{cpu}", flush=True)
        mo, mt = statistics.median(ours), statistics.median(theirs)
        ratios = sorted(o / t_ for o, t_ in zip(ours, theirs))
        line = (f"threads {t}: median over {a.rounds} rounds: isolane {mo:.2f} ms, onnxruntime {mt:.2f} ms,"
                f" ratio of medians {mo / mt:.2f}, median per-round ratio {statistics.median(ratios):.2f}")
        if t == 1:
            co, ct = statistics.median(ours_cpu), statistics.median(theirs_cpu)
            line += f"; cpu time {co:.2f} vs {ct:.2f} ms, ratio {co / ct:.2f}"
        print(f"{line} (load average now {os.getloadavg()[0]:.2f})", flush=True)


if __name__ == "__main__":
    main()
