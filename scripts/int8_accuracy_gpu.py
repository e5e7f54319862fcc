#!/usr/bin/env python3
"""Top-1 accuracy and agreement with fp32 of the trained digits CNN, per backend and precision,
as `isolane infer --labels` reports them; writes a markdown table.

The model, its held-out items and labels, its calibration items and onnxruntime's QDQ files are
the fixture crates/isolane-engine/tests/fixtures/digits/ (scripts/int8_accuracy_train.py; its
README gives onnxruntime's own figures). Rows:

- digits.onnx at each float precision (cuda: fp32, tf32, fp16, bf16; cpu: fp32);
- digits.onnx quantized by isolane from calibration/: int8 percentile, int8 entropy, fp8
  percentile (cuda runs them at fp16 with the products on the int8 / fp8 tensor cores);
- onnxruntime's QDQ files (quantize_static: per-channel int8, and float8 e4m3) as imported,
  at fp16 and fp32 on cuda, fp32 on cpu.

"Agreement with fp32" is with the model as given at fp32 on the CPU backend: digits.onnx's
answers for the float and isolane-calibrated rows; for a QDQ file, the file's own answers (its
exact ONNX semantics), so that a cuda row says whether the GPU computes what the file says.
A row whose plan check refuses it is run again with --no-plan-check, and says so. Every row
runs with ISOLANE_CUDA_QUANT_FALLBACK=off, so that a calibrated row runs its quantized plan.

Standard library only. On the GPU machine, from the repository root:

    python3 scripts/int8_accuracy_gpu.py --isolane stage/isolane --out "$OUT"

(`bash scripts/session-gpu.sh int8acc` runs it, cuda then cpu.) Here, without a GPU:

    python3 scripts/int8_accuracy_gpu.py --isolane target/debug/isolane --backends cpu
"""

import argparse
import os
import re
import subprocess
import sys
import time

FIXTURE = os.path.join("crates", "isolane-engine", "tests", "fixtures", "digits")
LINE = re.compile(
    r"^labels\s+top-1 accuracy (\d+)/(\d+) \(([\d.]+) %\), agreement with fp32 (\d+)/(\d+) "
    r"\(([\d.]+) %\)"
)


def rows(backend):
    """(model file, precision, calibration method or None, what) for one backend."""
    fl = ["fp32", "tf32", "fp16", "bf16"] if backend == "cuda" else ["fp32"]
    out = [("digits.onnx", p, None, "float") for p in fl]
    out += [
        ("digits.onnx", "int8", "percentile", "isolane calibration"),
        ("digits.onnx", "int8", "entropy", "isolane calibration"),
        ("digits.onnx", "fp8", "percentile", "isolane calibration"),
    ]
    qp = ["fp16", "fp32"] if backend == "cuda" else ["fp32"]
    for f in ["digits_int8_qdq.onnx", "digits_fp8_qdq.onnx"]:
        out += [(f, p, None, "onnxruntime QDQ; agreement with the file itself on the CPU") for p in qp]
    return out


def run(isolane, backend, model, precision, method, extra):
    d = FIXTURE
    cmd = [
        isolane,
        "infer",
        "--backend",
        backend,
        "--model",
        os.path.join(d, model),
        "--input",
        os.path.join(d, "heldout.npy"),
        "--labels",
        os.path.join(d, "heldout_labels.npy"),
        "--precision",
        precision,
    ]
    if method:
        cmd += ["--calibration", os.path.join(d, "calibration"), "--calibration-method", method]
    cmd += extra
    t0 = time.time()
    # The quantized plan always: on cuda a calibrated model otherwise runs its fp16 plan where
    # that is faster (docs/cuda.md, "The whole model against its float plan"), and these rows
    # measure the quantized arithmetic's accuracy.
    env = dict(os.environ, ISOLANE_CUDA_QUANT_FALLBACK="off")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    return p, cmd, time.time() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--isolane", default=os.environ.get("ISOLANE_BIN", "stage/isolane"))
    ap.add_argument("--backends", default="cuda,cpu")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    log = open(os.path.join(args.out, "int8acc.log"), "w")
    table = [
        "| backend | file | precision | calibration | top-1 accuracy | agreement with fp32 | note |",
        "| --- | --- | --- | --- | ---: | ---: | --- |",
    ]
    failed = 0
    for backend in args.backends.split(","):
        for model, precision, method, what in rows(backend):
            note = what
            p, cmd, secs = run(args.isolane, backend, model, precision, method, [])
            if p.returncode != 0 and "plan check" in p.stderr:
                why = p.stderr.strip().splitlines()[-1][:160].replace("|", "\\|")
                note += "; plan check refused it: " + why
                p, cmd, secs = run(
                    args.isolane, backend, model, precision, method, ["--no-plan-check"]
                )
                note += "; run with --no-plan-check"
            log.write(f"$ {' '.join(cmd)}\n# exit {p.returncode}, {secs:.1f} s\n")
            log.write(p.stdout + p.stderr + "\n")
            log.flush()
            m = next((LINE.match(l) for l in p.stdout.splitlines() if LINE.match(l)), None)
            if p.returncode != 0 or m is None:
                failed += 1
                err = (p.stderr.strip().splitlines() or ["no labels line"])[-1][:200]
                err = err.replace("|", "\\|")
                table.append(
                    f"| {backend} | {model} | {precision} | {method or ''} | — | — | "
                    f"exit {p.returncode}: {err} |"
                )
            else:
                c, n, acc, a, _, agr = m.groups()
                table.append(
                    f"| {backend} | {model} | {precision} | {method or ''} | {acc} % ({c}/{n}) "
                    f"| {agr} % ({a}/{n}) | {note} |"
                )
            print(table[-1], flush=True)
    head = [
        "# Trained digits CNN: accuracy per backend and precision",
        "",
        "360 held-out items of scikit-learn's digits (crates/isolane-engine/tests/fixtures/digits,",
        "scripts/int8_accuracy_train.py); `isolane infer --labels`, via",
        "`python3 scripts/int8_accuracy_gpu.py`. Agreement: with the model as given at fp32 on the",
        "CPU backend (digits.onnx; for a QDQ file, the file itself). onnxruntime itself: fp32",
        "99.44 %, its int8 QDQ file 99.44 % (100 % agreement with digits.onnx), its fp8 QDQ file",
        "98.89 % (99.44 %).",
        "",
    ]
    with open(os.path.join(args.out, "int8acc.md"), "w") as f:
        f.write("\n".join(head + table) + "\n")
    print(f"wrote {os.path.join(args.out, 'int8acc.md')} ({failed} rows failed)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
