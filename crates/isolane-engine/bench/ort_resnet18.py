#!/usr/bin/env python3
"""Baseline for the CPU backend: onnxruntime on a resnet18 built with onnx.helper (torchvision's
architecture, random weights, BN folded the way ORT would fold it anyway).

usage: python3 bench/ort_resnet18.py [threads] [iters]   -> prints the median ms of session.run
"""
import sys, time
import numpy as np
import onnx
from onnx import helper, TensorProto, numpy_helper
import onnxruntime as ort

rng = np.random.default_rng(0)
nodes, inits = [], []
uid = [0]


def name(p):
    uid[0] += 1
    return f"{p}_{uid[0]}"


def const(arr, p):
    n = name(p)
    inits.append(numpy_helper.from_array(arr.astype(np.float32), n))
    return n


def conv(x, cin, cout, k, s, pad, relu=True):
    w = const(rng.normal(0, np.sqrt(2 / (cin * k * k)), (cout, cin, k, k)), "w")
    b = const(rng.normal(0, 0.02, (cout,)), "b")
    y = name("conv")
    nodes.append(helper.make_node("Conv", [x, w, b], [y], kernel_shape=[k, k], strides=[s, s], pads=[pad] * 4))
    if relu:
        z = name("relu")
        nodes.append(helper.make_node("Relu", [y], [z]))
        return z
    return y


def block(x, cin, cout, s):
    y = conv(x, cin, cout, 3, s, 1)
    y = conv(y, cout, cout, 3, 1, 1, relu=False)
    sc = conv(x, cin, cout, 1, s, 0, relu=False) if (s != 1 or cin != cout) else x
    a = name("add")
    nodes.append(helper.make_node("Add", [y, sc], [a]))
    r = name("relu")
    nodes.append(helper.make_node("Relu", [a], [r]))
    return r


x = conv("input", 3, 64, 7, 2, 3)
p = name("pool")
nodes.append(helper.make_node("MaxPool", [x], [p], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4))
x, cin = p, 64
for cout, s in [(64, 1), (128, 2), (256, 2), (512, 2)]:
    x = block(x, cin, cout, s)
    x = block(x, cout, cout, 1)
    cin = cout
g = name("gap")
nodes.append(helper.make_node("GlobalAveragePool", [x], [g]))
f = name("flat")
nodes.append(helper.make_node("Flatten", [g], [f], axis=1))
w = const(rng.normal(0, 1 / np.sqrt(512), (1000, 512)), "fcw")
b = const(rng.normal(0, 0.02, (1000,)), "fcb")
nodes.append(helper.make_node("Gemm", [f, w, b], ["output"], transB=1))
graph = helper.make_graph(nodes, "resnet18", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 224, 224])],
                          [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 1000])], inits)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
iters = int(sys.argv[2]) if len(sys.argv) > 2 else 50
so = ort.SessionOptions()
so.intra_op_num_threads = threads
so.inter_op_num_threads = 1
sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
inp = rng.normal(size=(1, 3, 224, 224)).astype(np.float32)
for _ in range(5):
    sess.run(None, {"input": inp})
ts = []
for _ in range(iters):
    t = time.perf_counter()
    sess.run(None, {"input": inp})
    ts.append((time.perf_counter() - t) * 1e3)
ts.sort()
print(f"onnxruntime {ort.__version__} resnet18 batch 1 threads {threads}: median {ts[len(ts)//2]:.2f} ms, p90 {ts[len(ts)*9//10]:.2f} ms")
