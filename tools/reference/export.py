#!/usr/bin/env python3
"""Exports torchvision models with seeded random weights, so isolane can be compared with
PyTorch on the same weights and input.

For each model NAME it writes, under OUT/NAME/:
    NAME.safetensors  the state dict (torchvision tensor names)
    NAME.onnx         torch.onnx.export, classic exporter (dynamo=False), opset 17, dynamic batch
    input.npy         a seeded standard-normal input, batch 1
    output.npy        PyTorch's fp32 output on the CPU (TF32 off), batch 1
    output_torch_P.npy  with --torch-cuda P,...: PyTorch's own output on the GPU at precision P
                      (fp32, tf32, fp16, bf16), so that compare.py can show how far PyTorch
                      itself moves from the fp32 reference at that precision

Weights: torch.manual_seed(seed), the model's own initialisation, then every tensor that the
initialisation leaves constant (BatchNorm running stats and affine parameters, LayerNorm
parameters, zero-initialised heads and class tokens) is randomised, so that the BatchNorm
folding and every parameter are actually exercised and no output is trivially zero.

Runs where PyTorch and torchvision are installed (the GPU machine). yolov8n is built by
Ultralytics (`pip install ultralytics`; `DetectionModel("yolov8n.yaml", nc=80)`, no download)
and its reference output is eval-mode `model(x)[0]`, `[1, 84, 8400]` at 640×640.

    python3 tools/reference/export.py --out /tmp/ref resnet18 mobilenet_v2 vit_b_16
    python3 tools/reference/export.py --classes crates/isolane-engine/src/io/imagenet_classes.txt
"""

import argparse
import json
import os
import struct

import numpy as np
import torch
import torchvision

# Input sizes that differ from 224 (torchvision's reference transforms).
INPUT_SIZE = {"fcn_resnet50": 520, "yolov8n": 640}


def build(name):
    if name == "yolov8n":
        from ultralytics.nn.tasks import DetectionModel

        # Ultralytics' own definition (yolov8n.yaml: depth 0.33, width 0.25, Detect with nc=80,
        # reg_max=16); the yaml ships with the package, nothing is downloaded.
        return DetectionModel("yolov8n.yaml", nc=80, verbose=False)
    kwargs = {"weights": None}
    if name.startswith("fcn_"):
        # No pretrained backbone download, no auxiliary head (isolane's fcn_resnet50 has none).
        kwargs.update(weights_backbone=None, aux_loss=False)
    return torchvision.models.get_model(name, **kwargs)


def randomise_constants(model, gen):
    """Randomises every floating tensor of the state dict that initialisation left constant
    (state_dict tensors share storage with the model, so this changes the model)."""
    with torch.no_grad():
        for key, t in model.state_dict().items():
            if not t.is_floating_point() or t.numel() <= 1:
                continue
            if float(t.max() - t.min()) != 0.0:
                continue
            if key.endswith("running_var") or (t.dim() == 1 and float(t.flatten()[0]) == 1.0):
                # variances and norm scales: positive, around 1
                t.copy_(torch.empty_like(t).uniform_(0.5, 1.5, generator=gen))
            else:
                t.copy_(torch.empty_like(t).normal_(0.0, 0.05, generator=gen))


class OutOnly(torch.nn.Module):
    """Segmentation models return a dict; export and compare its "out" tensor. Ultralytics'
    Detect returns (decoded predictions, raw head outputs) in eval mode: keep the first."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x):
        y = self.m(x)
        if isinstance(y, dict):
            return y["out"]
        return y[0] if isinstance(y, (tuple, list)) else y


def save_safetensors(state, path):
    """A minimal safetensors writer (header JSON + little-endian data): no extra package."""
    dtypes = {torch.float32: "F32", torch.int64: "I64", torch.float16: "F16"}
    header, blobs, off = {}, [], 0
    for k, t in state.items():
        t = t.detach().cpu().contiguous()
        b = t.numpy().tobytes()
        header[k] = {"dtype": dtypes[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def torch_cuda_output(wrapped, x, prec):
    """PyTorch's output at `prec` on the GPU (a copy of the model; the fp32 one is untouched)."""
    import copy

    dtype = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[prec]
    tf32 = prec == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    try:
        m = copy.deepcopy(wrapped).to("cuda", dtype).eval()
        with torch.no_grad():
            y = m(x.to("cuda", dtype)).float().cpu()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    del m
    torch.cuda.empty_cache()
    return y


def export(name, out, seed, opset, onnx=True, torch_cuda=()):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    torch.manual_seed(seed)
    model = build(name)
    gen = torch.Generator().manual_seed(seed + 1)
    randomise_constants(model, gen)
    model.eval()
    save_safetensors(model.state_dict(), os.path.join(d, f"{name}.safetensors"))

    size = INPUT_SIZE.get(name, 224)
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(seed + 2))
    wrapped = OutOnly(model).eval()
    with torch.no_grad():
        y = wrapped(x)
    np.save(os.path.join(d, "input.npy"), x.numpy().astype(np.float32))
    np.save(os.path.join(d, "output.npy"), y.numpy().astype(np.float32))
    for prec in torch_cuda:
        yp = torch_cuda_output(wrapped, x, prec)
        np.save(os.path.join(d, f"output_torch_{prec}.npy"), yp.numpy().astype(np.float32))

    if not onnx:
        print(f"{name}: input {tuple(x.shape)} output {tuple(y.shape)} -> {d} (no ONNX)", flush=True)
        return
    torch.onnx.export(
        wrapped,
        (x,),
        os.path.join(d, f"{name}.onnx"),
        opset_version=opset,
        dynamo=False,
        input_names=["input"],
        output_names=["output"],
        dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
        do_constant_folding=True,
    )
    print(f"{name}: input {tuple(x.shape)} output {tuple(y.shape)} -> {d}", flush=True)


def write_classes(path):
    cats = torchvision.models.ResNet18_Weights.IMAGENET1K_V1.meta["categories"]
    assert len(cats) == 1000
    with open(path, "w") as f:
        f.write("\n".join(cats) + "\n")
    print(f"wrote {len(cats)} ImageNet class names to {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", help="torchvision model names")
    ap.add_argument("--out", default="reference-out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--opset", type=int, default=17)
    ap.add_argument("--classes", help="write torchvision's ImageNet class names to this file")
    ap.add_argument("--no-onnx", action="store_true",
                    help="safetensors, input and output only (for compare.py --kinds safetensors)")
    ap.add_argument("--torch-cuda", default="",
                    help="also save PyTorch's own GPU output at these precisions, e.g. fp32,tf32,fp16,bf16")
    args = ap.parse_args()
    torch_cuda = [p for p in args.torch_cuda.split(",") if p]
    bad = [p for p in torch_cuda if p not in ("fp32", "tf32", "fp16", "bf16")]
    if bad:
        ap.error(f"--torch-cuda: unknown precision {bad[0]!r} (allowed: fp32, tf32, fp16, bf16)")
    if torch_cuda and not torch.cuda.is_available():
        ap.error("--torch-cuda needs a CUDA GPU")
    # fp32 reference: no TF32 anywhere, deterministic CPU maths.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_num_threads(os.cpu_count() or 1)
    if args.classes:
        write_classes(args.classes)
    for name in args.models:
        export(name, args.out, args.seed, args.opset, onnx=not args.no_onnx, torch_cuda=torch_cuda)


if __name__ == "__main__":
    main()
