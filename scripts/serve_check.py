#!/usr/bin/env python3
"""What a served model computes against `isolane infer` on the same input, over HTTP and gRPC.

    python3 scripts/serve_check.py --http 127.0.0.1:8000 --grpc 127.0.0.1:8001 \
        --model mobilenet_v2 --input x.npy --reference y.npy [--output-name NAME]

`y.npy` comes from `isolane infer --model M --weights-seed 22026830 --input x.npy
--save-output y.npy` (22026830: a scenario's default [timing] seed, which a served built-in's
synthetic weights use) with the served workload's backend and precision. Prints one JSON line:
the largest absolute difference and whether the outputs are bit-identical, per protocol. A GPU
model served in a green partition may pick other kernels than the whole GPU (docs/cuda.md), so
a small difference there is expected and reported, not hidden.
"""
import argparse
import json

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--http", required=True)
    p.add_argument("--grpc", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--input", required=True)
    p.add_argument("--reference", required=True)
    a = p.parse_args()
    x = np.load(a.input).astype(np.float32)
    ref = np.load(a.reference).astype(np.float32)
    out = {"model": a.model}
    for name, mod, url in (("http", httpclient, a.http), ("grpc", grpcclient, a.grpc)):
        c = mod.InferenceServerClient(url)
        meta = c.get_model_metadata(a.model)
        inputs = meta["inputs"] if isinstance(meta, dict) else [
            {"name": t.name} for t in meta.inputs]
        outputs = meta["outputs"] if isinstance(meta, dict) else [
            {"name": t.name} for t in meta.outputs]
        i = mod.InferInput(inputs[0]["name"], list(x.shape), "FP32")
        if mod is httpclient:
            i.set_data_from_numpy(x, binary_data=True)
        else:
            i.set_data_from_numpy(x)
        y = c.infer(a.model, [i]).as_numpy(outputs[0]["name"]).reshape(ref.shape)
        out[name] = {
            "max_abs_diff": float(np.abs(y - ref).max()),
            "max_abs_ref": float(np.abs(ref).max()),
            "bit_identical": bool(np.array_equal(y.view(np.uint32), ref.view(np.uint32))),
            "top1_equal": bool((y.reshape(len(y), -1).argmax(1) == ref.reshape(len(ref), -1).argmax(1)).all()),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
