#!/usr/bin/env python3
"""The torch-exported ViT the cuda emulator tests run (tests/emulate.rs): a torchvision
VisionTransformer (1 layer, 2 heads, hidden 64 → head dim 32, image 32, patch 8), random
weights, exported exactly as issue 12 reports it wrong on cuda:
`torch.onnx.export(model, x, f, opset_version=17, dynamo=False)` with a dynamic batch.
Also writes a seeded input and onnxruntime's CPU output beside it.

    python3 crates/isolane-cuda/tests/data/make_vit_fixture.py --out crates/isolane-cuda/tests/data
"""

import argparse
import os

import numpy as np
import onnxruntime as ort
import torch
from torchvision.models.vision_transformer import VisionTransformer

NAME = "torch_vit_l1_h2_i32_p8_op17"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = VisionTransformer(image_size=32, patch_size=8, num_layers=1, num_heads=2,
                              hidden_dim=64, mlp_dim=128, num_classes=10).eval()
    with torch.no_grad():
        # torchvision initialises the class token, positional embedding and some biases to
        # zero: make every parameter non-trivial so that each term shows in the output.
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    path = os.path.join(args.out, NAME + ".onnx")
    torch.onnx.export(model, (x,), path, opset_version=17, dynamo=False, input_names=["input"],
                      output_names=["output"],
                      dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    y = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run(
        None, {"input": x.numpy()})[0]
    with torch.no_grad():
        yt = model(x).numpy()
    err = float(np.linalg.norm(y - yt) / np.linalg.norm(yt))
    assert err < 1e-5, f"onnxruntime vs torch: {err}"
    np.save(os.path.join(args.out, NAME + ".input.npy"), x.numpy())
    np.save(os.path.join(args.out, NAME + ".output.npy"), y.astype(np.float32))
    print(f"{path}: {os.path.getsize(path)} bytes, output {y.shape}, onnxruntime vs torch {err:.1e}")


if __name__ == "__main__":
    main()
