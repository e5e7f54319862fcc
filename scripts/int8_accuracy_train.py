#!/usr/bin/env python3
"""Trains the small digits CNN whose files are isolane's int8/fp8 accuracy fixture, exports it
as users do, quantizes it with onnxruntime, and records onnxruntime's outputs.

Why a trained model: a model with random weights has no accuracy, so "top-1 agreement with
fp32" on it says little (its logits are nearly flat). This one is trained on scikit-learn's
`load_digits` (1,797 8x8 grey images of 10 digits, shipped inside the package: no download),
upsampled to 16x16, and reaches a real held-out accuracy.

Writes crates/isolane-engine/tests/fixtures/digits/ (or --out DIR):
  digits.onnx               fp32, torch.onnx.export, opset 17, dynamic batch
  digits_int8_qdq.onnx      onnxruntime quantize_static, QDQ, per-channel int8 weights,
                            int8 activations, calibrated on calibration/
  digits_fp8_qdq.onnx       the same with float8 e4m3 (opset 19), where onnxruntime can
  calibration/calib.npy     64 training items [64, 1, 16, 16] f32
  heldout.npy               the held-out items [360, 1, 16, 16] f32
  heldout_labels.npy        their classes [360] int64
  ort_<name>.npy            onnxruntime's outputs on heldout.npy for each .onnx above
                            (graph optimisations off: the ONNX operators as the spec says)
  results.json              accuracies and agreements onnxruntime measured

Reproducible: fixed seeds, one thread, deterministic algorithms; a re-run with the same
package versions writes the same accuracies (and, on the same machine, the same bytes).

Needs: pip install torch onnx onnxruntime scikit-learn numpy (written with torch 2.15 CPU,
onnx 1.23, onnxruntime 1.32, scikit-learn 1.9, numpy 2.4).

    python3 scripts/int8_accuracy_train.py [--out DIR]
"""

import argparse
import json
import os
import sys

import numpy as np

SEED = 0
SIDE = 16
CALIB_ITEMS = 64
EPOCHS = 40


def load_data():
    """Digits upsampled to SIDE x SIDE (bilinear), scaled to [0, 1] and standardised with the
    training set's mean and std; a stratified 80/20 split."""
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = torch.from_numpy((d.images / 16.0).astype(np.float32)).unsqueeze(1)
    x = F.interpolate(x, size=(SIDE, SIDE), mode="bilinear", align_corners=False).numpy()
    y = d.target.astype(np.int64)
    xtr, xte, ytr, yte = train_test_split(
        x, y, test_size=0.2, random_state=SEED, stratify=y
    )
    mean, std = float(xtr.mean()), float(xtr.std())
    xtr = ((xtr - mean) / std).astype(np.float32)
    xte = ((xte - mean) / std).astype(np.float32)
    return xtr, ytr, xte, yte, mean, std


def make_model():
    import torch.nn as nn

    class Block(nn.Module):
        """A ResNet basic block: two 3x3 conv + BN, a residual add, ReLU."""

        def __init__(self, c):
            super().__init__()
            self.c1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.b1 = nn.BatchNorm2d(c)
            self.c2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.b2 = nn.BatchNorm2d(c)
            self.relu = nn.ReLU()

        def forward(self, x):
            y = self.relu(self.b1(self.c1(x)))
            return self.relu(self.b2(self.c2(y)) + x)

    class DigitsNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(
                nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU()
            )
            self.block = Block(16)
            self.pool = nn.MaxPool2d(2)
            self.conv = nn.Sequential(
                nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU()
            )
            self.gap = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(32, 10)

        def forward(self, x):
            x = self.pool(self.block(self.stem(x)))
            x = self.gap(self.conv(x)).flatten(1)
            return self.fc(x)

    return DigitsNet()


def train(xtr, ytr):
    import torch
    import torch.nn as nn

    torch.manual_seed(SEED)
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, EPOCHS)
    lossf = nn.CrossEntropyLoss()
    xt, yt = torch.from_numpy(xtr), torch.from_numpy(ytr)
    g = torch.Generator().manual_seed(SEED)
    for epoch in range(EPOCHS):
        model.train()
        perm = torch.randperm(len(xt), generator=g)
        total = 0.0
        for i in range(0, len(xt), 64):
            idx = perm[i : i + 64]
            xb = xt[idx]
            # Small random shifts (by up to one pixel) keep the convs from memorising.
            dx, dy = (int(v) for v in torch.randint(-1, 2, (2,), generator=g))
            xb = torch.roll(xb, shifts=(dy, dx), dims=(2, 3))
            opt.zero_grad()
            loss = lossf(model(xb), yt[idx])
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        sched.step()
        if epoch % 10 == 9 or epoch == EPOCHS - 1:
            print(f"epoch {epoch + 1:3}: loss {total / len(xt):.4f}", file=sys.stderr)
    return model.eval()


def ort_run(path, x):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, {sess.get_inputs()[0].name: x})
    return y.astype(np.float32)


def quantize(fp32_path, out_path, calib, qtype, per_channel, opset19):
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter([{"input": calib[i : i + 1]} for i in range(len(calib))])

        def get_next(self):
            return next(self.items, None)

    src = fp32_path
    if opset19:
        # float8 QuantizeLinear / DequantizeLinear exist from opset 19 on.
        from onnx import version_converter

        m = version_converter.convert_version(onnx.load(fp32_path), 19)
        src = out_path + ".opset19.onnx"
        onnx.save(m, src)
    try:
        quantize_static(
            src,
            out_path,
            Reader(),
            quant_format=QuantFormat.QDQ,
            per_channel=per_channel,
            activation_type=qtype,
            weight_type=qtype,
            # onnxruntime calibrates float8 only by its Distribution method.
            calibrate_method=(
                CalibrationMethod.Distribution if opset19 else CalibrationMethod.MinMax
            ),
            # By default onnxruntime removes a ReLU before a QuantizeLinear, relying on the
            # quantized type's zero point to clip the negatives: right for int8 (its zero point
            # is then the type's minimum), wrong for float8 (symmetric, no zero point to clip):
            # its fp8 file without this flag scores 10 % in onnxruntime itself.
            extra_options={"QDQKeepRemovableActivations": opset19},
        )
    finally:
        if opset19 and os.path.exists(src):
            os.remove(src)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--out",
        default=os.path.join(
            os.path.dirname(os.path.abspath(__file__)),
            "..",
            "crates",
            "isolane-engine",
            "tests",
            "fixtures",
            "digits",
        ),
    )
    args = ap.parse_args()
    out = os.path.normpath(args.out)
    os.makedirs(os.path.join(out, "calibration"), exist_ok=True)

    import torch

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    np.random.seed(SEED)

    xtr, ytr, xte, yte, mean, std = load_data()
    model = train(xtr, ytr)
    with torch.no_grad():
        torch_acc = float((model(torch.from_numpy(xte)).argmax(1).numpy() == yte).mean())
    print(f"torch held-out accuracy {100 * torch_acc:.2f} %", file=sys.stderr)

    fp32 = os.path.join(out, "digits.onnx")
    # The classic exporter with dynamic_axes: what most users' export scripts still do.
    torch.onnx.export(
        model,
        (torch.from_numpy(xte[:1]),),
        fp32,
        opset_version=17,
        input_names=["input"],
        output_names=["logits"],
        dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
        dynamo=False,
    )

    # Calibration items: the first CALIB_ITEMS of a seeded shuffle of the training split.
    pick = np.random.default_rng(SEED).permutation(len(xtr))[:CALIB_ITEMS]
    calib = np.ascontiguousarray(xtr[pick])
    np.save(os.path.join(out, "calibration", "calib.npy"), calib)
    np.save(os.path.join(out, "heldout.npy"), np.ascontiguousarray(xte))
    np.save(os.path.join(out, "heldout_labels.npy"), yte.astype(np.int64))

    from onnxruntime.quantization import QuantType

    made = {"digits": fp32}
    int8 = os.path.join(out, "digits_int8_qdq.onnx")
    quantize(fp32, int8, calib, QuantType.QInt8, per_channel=True, opset19=False)
    made["digits_int8_qdq"] = int8
    fp8 = os.path.join(out, "digits_fp8_qdq.onnx")
    try:
        quantize(fp32, fp8, calib, QuantType.QFLOAT8E4M3FN, per_channel=False, opset19=True)
        ort_run(fp8, xte[:2])
        made["digits_fp8_qdq"] = fp8
    except Exception as e:  # noqa: BLE001 - any failure means "onnxruntime cannot", recorded
        print(f"onnxruntime made no usable fp8 QDQ file: {e}", file=sys.stderr)
        if os.path.exists(fp8):
            os.remove(fp8)

    results = {
        "seed": SEED,
        "side": SIDE,
        "normalise": {"mean": mean, "std": std},
        "train_items": int(len(xtr)),
        "heldout_items": int(len(xte)),
        "calibration_items": CALIB_ITEMS,
        "torch_accuracy": torch_acc,
        "versions": {},
        "onnxruntime": {},
    }
    import onnx
    import onnxruntime
    import sklearn

    results["versions"] = {
        "torch": torch.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
        "scikit-learn": sklearn.__version__,
        "numpy": np.__version__,
    }
    ref = None
    for name, path in made.items():
        y = ort_run(path, xte)
        np.save(os.path.join(out, f"ort_{name}.npy"), y)
        top = y.argmax(1)
        if ref is None:
            ref = top
        results["onnxruntime"][name] = {
            "accuracy": float((top == yte).mean()),
            "top1_agreement_with_fp32": float((top == ref).mean()),
            "bytes": os.path.getsize(path),
        }
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=2, sort_keys=True)
        f.write("\n")
    for name, r in results["onnxruntime"].items():
        print(
            f"{name:18} accuracy {100 * r['accuracy']:.2f} %, agreement with fp32 "
            f"{100 * r['top1_agreement_with_fp32']:.2f} %, {r['bytes']} bytes"
        )


if __name__ == "__main__":
    main()
