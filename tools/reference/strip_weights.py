#!/usr/bin/env python3
"""Writes a copy of an ONNX model whose initializers of more than 1024 elements live in an
external file, so that the (small) graph can be moved to another machine and its import
debugged there: create a same-sized zero file in place of the weights with
`truncate -s SIZE NAME.weights` and `isolane infer --model NAME.onnx --random` imports it.

    python3 tools/reference/strip_weights.py IN.onnx OUT_DIR
"""

import os
import sys

import onnx


def main():
    src, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    name = os.path.splitext(os.path.basename(src))[0]
    m = onnx.load(src)
    dst = os.path.join(out, name + ".onnx")
    onnx.save_model(m, dst, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=name + ".weights", size_threshold=4096)
    size = os.path.getsize(os.path.join(out, name + ".weights"))
    print(f"{dst}: {os.path.getsize(dst)} bytes of graph; weights {size} bytes in {name}.weights")


if __name__ == "__main__":
    main()
