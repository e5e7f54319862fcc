#!/usr/bin/env python3
"""Models exported by the real PyTorch exporter that the cuda tests run (tests/emulate.rs on
the CPU, tests/gpu.rs on the GPU), each as issue 12 reports a user's export:
`torch.onnx.export(model, x, f, opset_version=17, dynamo=False)` with a dynamic batch.

- torch_vit_l1_h2_i32_p8_op17: a torchvision VisionTransformer (1 layer, 2 heads, hidden 128 →
  head dim 64 as in ViT-B and ViT-L, image 32, patch 8): its attention is torch's
  scaled-dot-product export.
- torch_densenet_tiny_op17: a torchvision DenseNet (growth 8, blocks (2, 2), 16 initial
  features, image 32): BatchNormalizations of concatenated features that follow no
  convolution.

Random weights (every parameter and BatchNorm statistic non-trivial); a seeded input and
onnxruntime's CPU output are written beside each.

    python3 crates/isolane-cuda/tests/data/make_torch_fixtures.py --out crates/isolane-cuda/tests/data
"""

import argparse
import os

import numpy as np
import onnxruntime as ort
import torch
from torchvision.models.densenet import DenseNet
from torchvision.models.vision_transformer import VisionTransformer


def randomise(model, seed):
    """torchvision zero-initialises the class token, positional embedding, biases and the
    BatchNorm statistics: perturb every float tensor so that each term shows in the output."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for k, t in model.state_dict().items():
            if not t.is_floating_point():
                continue
            if k.endswith("running_var"):
                t.copy_(torch.empty_like(t).uniform_(0.5, 1.5, generator=g))
            else:
                t.add_(torch.randn(t.shape, generator=g) * 0.2)


def export(model, name, size, out, seed):
    randomise(model, seed)
    model.eval()
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(seed + 1))
    path = os.path.join(out, name + ".onnx")
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
    assert err < 1e-5, f"{name}: onnxruntime vs torch {err}"
    np.save(os.path.join(out, name + ".input.npy"), x.numpy())
    np.save(os.path.join(out, name + ".output.npy"), y.astype(np.float32))
    print(f"{path}: {os.path.getsize(path)} bytes, output {y.shape}, onnxruntime vs torch {err:.1e}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    vit = VisionTransformer(image_size=32, patch_size=8, num_layers=1, num_heads=2,
                            hidden_dim=128, mlp_dim=128, num_classes=10)
    export(vit, "torch_vit_l1_h2_i32_p8_op17", 32, args.out, seed=1)
    dense = DenseNet(growth_rate=8, block_config=(2, 2), num_init_features=16, bn_size=2,
                     num_classes=10)
    export(dense, "torch_densenet_tiny_op17", 32, args.out, seed=2)


if __name__ == "__main__":
    main()
