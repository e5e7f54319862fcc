#!/usr/bin/env python3
"""CPU speed: isolane's CPU backend against onnxruntime, same model, same input size, same
thread count, measured in the same run (docs/onnx.md, "CPU speed").

The model is ResNet-18 with torchvision's exact structure, written here with onnx.helper and
seeded random weights (no PyTorch needed). Timed:
  * onnxruntime (pip) on that .onnx: all graph optimisations, intra-op threads = T,
    sequential execution;
  * isolane importing the same .onnx (`isolane infer --model FILE.onnx --repeat N`);
  * isolane's built-in resnet18 (`isolane infer --model resnet18 --repeat N`).
Each: warm-up runs, then the median (and p99) of N ≥ 50 timed runs of batch 1, in several
rounds that alternate the engines; reported: the best round and the median round.

    cargo build --release
    python3 bench/cpu_vs_ort.py [--isolane target/release/isolane] [--threads 2] [--runs 100]
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper


def resnet18_onnx(path, seed=0):
    """torchvision resnet18 as the classic exporter writes it after BN folding is *not* done:
    Conv, BatchNormalization, Relu, MaxPool, Add, GlobalAveragePool, Flatten, Gemm."""
    r = np.random.default_rng(seed)
    inits, nodes = [], []

    def param(name, arr):
        inits.append(numpy_helper.from_array(arr.astype(np.float32), name))
        return name

    def conv(x, name, cin, cout, k, stride, pad):
        w = param(f"{name}.weight", r.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k)))
        nodes.append(helper.make_node("Conv", [x, w], [f"{name}.out"], kernel_shape=[k, k],
                                      strides=[stride, stride], pads=[pad] * 4))
        return f"{name}.out"

    def bn(x, name, c):
        s = param(f"{name}.weight", r.uniform(0.5, 1.0, c))
        b = param(f"{name}.bias", r.normal(0, 0.1, c))
        m = param(f"{name}.running_mean", r.normal(0, 0.1, c))
        v = param(f"{name}.running_var", r.uniform(0.5, 1.5, c))
        nodes.append(helper.make_node("BatchNormalization", [x, s, b, m, v], [f"{name}.out"], epsilon=1e-5))
        return f"{name}.out"

    def relu(x):
        nodes.append(helper.make_node("Relu", [x], [f"{x}.relu"]))
        return f"{x}.relu"

    x = relu(bn(conv("input", "conv1", 3, 64, 7, 2, 3), "bn1", 64))
    nodes.append(helper.make_node("MaxPool", [x], ["pool"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
    x, cin = "pool", 64
    for li, (cout, stride) in enumerate([(64, 1), (128, 2), (256, 2), (512, 2)], start=1):
        for bi in range(2):
            s = stride if bi == 0 else 1
            p = f"layer{li}.{bi}"
            h = relu(bn(conv(x, f"{p}.conv1", cin, cout, 3, s, 1), f"{p}.bn1", cout))
            h = bn(conv(h, f"{p}.conv2", cout, cout, 3, 1, 1), f"{p}.bn2", cout)
            if s != 1 or cin != cout:
                sc = bn(conv(x, f"{p}.downsample.0", cin, cout, 1, s, 0), f"{p}.downsample.1", cout)
            else:
                sc = x
            nodes.append(helper.make_node("Add", [h, sc], [f"{p}.add"]))
            x, cin = relu(f"{p}.add"), cout
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap"]))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"], axis=1))
    fw = param("fc.weight", r.standard_normal((1000, 512)) / np.sqrt(512))
    fb = param("fc.bias", r.normal(0, 0.01, 1000))
    nodes.append(helper.make_node("Gemm", ["flat", fw, fb], ["output"], transB=1))
    g = helper.make_graph(nodes, "resnet18", [helper.make_tensor_value_info("input", onnx.TensorProto.FLOAT, ["batch", 3, 224, 224])],
                          [helper.make_tensor_value_info("output", onnx.TensorProto.FLOAT, ["batch", 1000])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, path)
    n_params = sum(int(np.prod(t.dims)) for t in inits if not t.name.endswith(("running_mean", "running_var")))
    assert n_params == 11_689_512, n_params  # torchvision's resnet18
    return path


def time_ort(path, threads, runs, warmup):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((1, 3, 224, 224)).astype(np.float32)
    for _ in range(warmup):
        sess.run(None, {"input": x})
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        sess.run(None, {"input": x})
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times)), float(np.percentile(times, 99))


def time_isolane(exe, model, threads, runs):
    cmd = [exe, "infer", "--model", model, "--random", "--threads", str(threads), "--repeat", str(runs)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{p.stderr}")
    m = re.search(r"median ([0-9.]+) ms, p99 ([0-9.]+) ms", p.stdout)
    if not m:
        raise SystemExit(f"no latency line in:\n{p.stdout}")
    return float(m.group(1)), float(m.group(2))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--isolane", default="target/release/isolane")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3, help="alternate the engines this many times")
    ap.add_argument("--json", help="also write the numbers here")
    args = ap.parse_args()
    if args.runs < 50:
        raise SystemExit("--runs must be at least 50")
    with tempfile.TemporaryDirectory() as d:
        path = resnet18_onnx(os.path.join(d, "resnet18.onnx"))
        res = {"ort": [], "isolane_onnx": [], "isolane_builtin": []}
        # Alternate the engines so that drift of the (shared) machine hits all of them alike.
        for _ in range(args.rounds):
            res["ort"].append(time_ort(path, args.threads, args.runs, args.warmup))
            res["isolane_onnx"].append(time_isolane(args.isolane, path, args.threads, args.runs))
            res["isolane_builtin"].append(time_isolane(args.isolane, "resnet18", args.threads, args.runs))
    # Per engine: the median of each round; reported as the best round (least disturbed) and
    # the median over rounds (typical), each as a ratio to onnxruntime's same statistic.
    best = {k: min(v) for k, v in res.items()}
    typ = {k: sorted(v)[len(v) // 2] for k, v in res.items()}
    print(f"resnet18, batch 1, {args.threads} thread(s), median of {args.runs} runs per round, {args.rounds} rounds")
    print("per-round medians (ms): " + "; ".join(
        f"{k} " + " ".join(f"{m:.1f}" for m, _ in v) for k, v in res.items()))
    for stat, d in [("best round", best), ("median round", typ)]:
        o = d["ort"][0]
        print(f"{stat}: onnxruntime {ort.__version__} {o:.2f} ms | isolane ONNX import {d['isolane_onnx'][0]:.2f} ms "
              f"= {d['isolane_onnx'][0] / o:.2f}x | isolane built-in {d['isolane_builtin'][0]:.2f} ms "
              f"= {d['isolane_builtin'][0] / o:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "runs": args.runs, "rounds": res, "best": best, "median_round": typ,
                       "onnxruntime_version": ort.__version__}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
