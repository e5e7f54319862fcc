"""Hugging Face vision models as users export them, through `isolane infer`, against onnxruntime.

Each model is built from its `transformers` config (random weights, seed 0, re-initialised so
that no activation vanishes: `reinit`; no hub download),
exported with `torch.onnx.export` (dynamo=True, PyTorch 2.9+'s default, and the classic
exporter at opset 17 with a dynamic batch), run by onnxruntime on the CPU as the reference, then
by `isolane infer --backend B --precision P` on the same input. A row passes when the output's
shape matches and its relative L2 error is within the conformance suite's limit for the
precision (scripts/conformance/suite.py: fp32 1e-4, tf32 5e-3, fp16 and bf16 3e-2); a
refusal (exit 2) is a row of its own with isolane's words. Writes a markdown table to --out and
one JSON line per row to --jsonl.

  python3 scripts/hf_models.py --isolane stage/isolane --backend cuda --precisions fp32,fp16 \\
      --work /tmp/hf --out hf.md [--models vit,deit] [--exporters dynamo,classic] [--budget-s 220] \\
      [--batch 2]
  python3 scripts/hf_models.py --fixture DIR   # the engine's classic-DETR regression fixture

`--batch N` feeds N distinct images (the dynamo export has a fixed batch: run it at 1).

Needs torch, transformers, onnx and onnxruntime (the GPU machine has them).
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

LIMITS = {"fp32": 1e-4, "tf32": 5e-3, "fp16": 3e-2, "bf16": 3e-2}

# name -> (config class, model class, config kwargs, input (h, w))
MODELS = {
    "vit": ("ViTConfig", "ViTForImageClassification", {}, None),
    "deit": ("DeiTConfig", "DeiTForImageClassification", {}, None),
    "beit": ("BeitConfig", "BeitForImageClassification", {"use_relative_position_bias": True}, None),
    "dinov2": ("Dinov2Config", "Dinov2ForImageClassification", {"image_size": 224}, None),
    "swin": ("SwinConfig", "SwinForImageClassification", {}, None),
    "convnext": ("ConvNextConfig", "ConvNextForImageClassification", {}, None),
    "resnet": ("ResNetConfig", "ResNetForImageClassification", {}, None),
    "mobilevit": ("MobileViTConfig", "MobileViTForImageClassification", {}, None),
    "segformer": ("SegformerConfig", "SegformerForSemanticSegmentation", {}, (512, 512)),
    "clip-vision": ("CLIPVisionConfig", "CLIPVisionModelWithProjection", {}, None),
    "efficientnet": ("EfficientNetConfig", "EfficientNetForImageClassification", {}, None),
    "regnet": ("RegNetConfig", "RegNetForImageClassification", {}, None),
    "levit": ("LevitConfig", "LevitForImageClassification", {}, None),
    "yolos": ("YolosConfig", "YolosForObjectDetection", {}, None),
    "dpt": ("DPTConfig", "DPTForDepthEstimation", {}, None),
    # session 25: the models docs/conformance.md's Run 12 found refused (Run 13)
    "detr": ("DetrConfig", "DetrForObjectDetection", {"use_pretrained_backbone": False}, None),
    "mobilevitv2": ("MobileViTV2Config", "MobileViTV2ForImageClassification", {}, None),
    # session 26: DETR's graph (the pixel mask held once along a moving batch axis, the
    # attention mask indexed by arange(B)·HW + position) at 12.5k parameters, Transformers'
    # own 2-stage ResNet as its backbone: the engine's regression fixture (--fixture)
    "detr-tiny": ("DetrConfig", "DetrForObjectDetection", {
        "use_timm_backbone": False, "use_pretrained_backbone": False, "backbone": None,
        "backbone_config": {"model_type": "resnet", "embedding_size": 8, "hidden_sizes": [8, 16],
                            "depths": [1, 1], "layer_type": "basic", "out_features": ["stage2"]},
        "d_model": 16, "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 2,
        "decoder_attention_heads": 2, "encoder_ffn_dim": 32, "decoder_ffn_dim": 32,
        "num_queries": 5, "num_labels": 3}, (64, 48)),
}
# timm models, by `timm/<name>`: timm.create_model(name, pretrained=False) at its
# pretrained_cfg's input size (needs timm; without it the row is an export-error)
TIMM = ["crossvit_tiny_240", "sequencer2d_s"]


def build(name):
    import torch

    if name.startswith("timm/"):
        import timm

        torch.manual_seed(0)
        m = timm.create_model(name[len("timm/"):], pretrained=False).eval()
        reinit(m, torch)
        return m, (1,) + tuple(m.pretrained_cfg["input_size"])
    import transformers

    conf_cls, model_cls, kwargs, hw = MODELS[name]
    torch.manual_seed(0)
    c = getattr(transformers, conf_cls)(**kwargs)
    m = getattr(transformers, model_cls)(c).eval()
    reinit(m, torch)
    if hw is None:
        size = getattr(c, "image_size", 224)
        hw = tuple(size) if isinstance(size, (list, tuple)) else (size, size)
    return m, (1, getattr(c, "num_channels", 3)) + tuple(hw)


def reinit(m, torch):
    """Fan-in scaled weights and varied BatchNorm statistics: Transformers' own initialisation
    leaves some deep conv nets' logits at 0 to 1e-41 (EfficientNet, MobileNetV2, MobileViT,
    LeViT), and a comparison of vanished activations is vacuous."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, (torch.nn.Conv2d, torch.nn.Linear)):
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=g) / mod.weight[0].numel() ** 0.5)
                if mod.bias is not None:
                    mod.bias.copy_(torch.randn(mod.bias.shape, generator=g) * 0.1)
            if isinstance(mod, torch.nn.BatchNorm2d):
                n = mod.num_features
                mod.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
                mod.running_var.copy_(torch.rand(n, generator=g) + 0.5)
                mod.weight.copy_(torch.rand(n, generator=g) + 0.5)
                mod.bias.copy_(torch.randn(n, generator=g) * 0.1)


def export(name, exporter, d, batch=1):
    import torch

    path = os.path.join(d, "model.onnx")
    if os.path.exists(path):
        return path, 0.0
    m, shape = build(name)
    # `batch` distinct images (seed 1): a classic export with a dynamic batch runs at it.
    x = torch.randn(batch, *shape[1:], generator=torch.Generator().manual_seed(1))
    np.save(os.path.join(d, "input.npy"), x.numpy())
    t = time.time()
    with torch.no_grad():
        if exporter == "dynamo":
            torch.onnx.export(m, (x,), path, input_names=["pixel_values"], dynamo=True)
        else:
            torch.onnx.export(m, (x,), path, input_names=["pixel_values"], dynamo=False,
                              opset_version=17, dynamic_axes={"pixel_values": {0: "batch"}})
    return path, time.time() - t


def reference(path, x, every=False):
    import onnxruntime as ort

    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    out = s.run(None, {s.get_inputs()[0].name: x})
    return out if every else out[0]


def fixture(out):
    """The engine's regression fixture for a classic DETR export (crates/isolane-engine/tests/
    fixtures/onnx/torch_detr_tiny_op17.*): detr-tiny exported classic (opset 17, dynamic
    batch), a batch of 2 distinct images, onnxruntime's logits (`.output.npy`) and boxes
    (`.boxes.npy`) for them."""
    import shutil

    os.makedirs(out, exist_ok=True)
    work = os.path.join(out, "detr-tiny-classic")
    os.makedirs(work, exist_ok=True)
    path, _ = export("detr-tiny", "classic", work, batch=2)
    x = np.load(os.path.join(work, "input.npy"))
    logits, boxes = reference(path, x, every=True)[:2]
    base = os.path.join(out, "torch_detr_tiny_op17")
    shutil.copy(path, base + ".onnx")
    np.save(base + ".input.npy", x)
    np.save(base + ".output.npy", logits.astype(np.float32))
    np.save(base + ".boxes.npy", boxes.astype(np.float32))
    shutil.rmtree(work)
    print(f"{base}.onnx: {os.path.getsize(base + '.onnx')} bytes, logits {logits.shape}, boxes {boxes.shape}")


def row(args, name, exporter, precision, path, d, ref):
    out = os.path.join(d, f"iso-{precision}.npy")
    if os.path.exists(out):
        os.remove(out)
    cmd = [args.isolane, "infer", "--model", path, "--input", os.path.join(d, "input.npy"),
           "--save-output", out, "--backend", args.backend, "--precision", precision]
    t = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.infer_timeout_s)
    r = {"model": name, "exporter": exporter, "precision": precision, "rc": p.returncode,
         "infer_s": round(time.time() - t, 1)}
    if p.returncode != 0:
        r["status"] = "refused" if p.returncode == 2 else "error"
        r["error"] = (p.stderr + p.stdout).strip()[-300:]
        return r
    y = np.load(out)
    if y.shape != ref.shape:
        r["status"] = "fail"
        r["error"] = f"shape {list(y.shape)} against onnxruntime's {list(ref.shape)}"
        return r
    rel = float(np.linalg.norm(y - ref) / max(np.linalg.norm(ref), 1e-30))
    r["rel_l2"] = rel
    if ref.ndim == 2:
        r["top1_same"] = bool((y.argmax(-1) == ref.argmax(-1)).all())
    r["status"] = "pass" if np.isfinite(y).all() and rel <= LIMITS[precision] else "fail"
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--isolane")
    ap.add_argument("--fixture", metavar="DIR",
                    help="write the engine's classic-DETR regression fixture into DIR and stop")
    ap.add_argument("--batch", type=int, default=1,
                    help="images per input (distinct; a classic export's dynamic batch)")
    ap.add_argument("--backend", default="cuda", choices=["cpu", "cuda"])
    ap.add_argument("--precisions", default="fp32,fp16")
    ap.add_argument("--exporters", default="dynamo,classic")
    ap.add_argument("--models", default=",".join(list(MODELS) + [f"timm/{t}" for t in TIMM]))
    ap.add_argument("--work")
    ap.add_argument("--out")
    ap.add_argument("--jsonl")
    ap.add_argument("--budget-s", type=float, default=1e9)
    ap.add_argument("--infer-timeout-s", type=float, default=120)
    args = ap.parse_args()
    if args.fixture:
        fixture(args.fixture)
        return
    for flag in ("isolane", "work", "out"):
        if getattr(args, flag) is None:
            sys.exit(f"--{flag} is required (or --fixture DIR)")
    if args.batch < 1:
        sys.exit(f"--batch {args.batch}: at least 1")
    precisions = args.precisions.split(",")
    for p in precisions:
        if p not in LIMITS:
            sys.exit(f"--precisions: `{p}` is not one of {', '.join(LIMITS)}")
    models = args.models.split(",")
    for m in models:
        if m not in MODELS and m[len("timm/"):] not in TIMM:
            sys.exit(f"--models: `{m}` is not one of {', '.join(MODELS)}, "
                     f"{', '.join('timm/' + t for t in TIMM)}")
    import torch
    import transformers

    start = time.time()
    rows = []
    os.makedirs(args.work, exist_ok=True)
    jl = open(args.jsonl, "a") if args.jsonl else None
    for name in models:
        for exporter in args.exporters.split(","):
            if time.time() - start > args.budget_s:
                rows.append({"model": name, "exporter": exporter, "status": "not run (budget)"})
                continue
            d = os.path.join(args.work, f"{name.replace('/', '-')}-{exporter}")
            os.makedirs(d, exist_ok=True)
            try:
                path, secs = export(name, exporter, d, args.batch)
                ref = reference(path, np.load(os.path.join(d, "input.npy")))
            except Exception as e:  # an exporter's or onnxruntime's refusal is a row, not a stop
                r = {"model": name, "exporter": exporter, "status": "export-error",
                     "error": f"{type(e).__name__}: {e}"[-300:]}
                rows.append(r)
                print(json.dumps(r), flush=True)
                continue
            for precision in precisions:
                try:
                    r = row(args, name, exporter, precision, path, d, ref)
                except subprocess.TimeoutExpired:
                    r = {"model": name, "exporter": exporter, "precision": precision,
                         "status": "error", "error": f"no answer in {args.infer_timeout_s} s"}
                rows.append(r)
                print(json.dumps(r), flush=True)
                if jl:
                    jl.write(json.dumps(r) + "\n")
                    jl.flush()
    counts = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    with open(args.out, "w") as f:
        f.write(f"# Hugging Face vision models through `isolane infer --backend {args.backend}`\n\n")
        f.write(f"torch {torch.__version__}, transformers {transformers.__version__}; random weights "
                f"from each config (seed 0), one input (seed 1); reference onnxruntime on the CPU. "
                f"Limits (relative L2): {', '.join(f'{p} {LIMITS[p]:g}' for p in precisions)}.\n\n")
        f.write("**" + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + "**\n\n")
        f.write("| model | exporter | precision | status | rel L2 | top-1 same | infer s | what |\n")
        f.write("| --- | --- | --- | --- | ---: | --- | ---: | --- |\n")
        for r in rows:
            rel = f"{r['rel_l2']:.2e}" if "rel_l2" in r else ""
            what = (r.get("error") or "").replace("\n", " ").replace("|", "\\|")[-200:]
            f.write(f"| {r['model']} | {r['exporter']} | {r.get('precision', '')} | {r['status']} | "
                    f"{rel} | {r.get('top1_same', '')} | {r.get('infer_s', '')} | {what} |\n")
    print(open(args.out).read())


if __name__ == "__main__":
    main()
