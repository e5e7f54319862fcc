#!/usr/bin/env bash
# Session 19's checks on the GPU machine, with a staged build (scripts/gpu-test.sh stage,
# STAGE_PACKAGES="-p isolane-cuda"; xz stage/isolane and stage/tests/isolane-cuda--gpu when the
# tree and stage together pass the carry limit; carry ["stage"]):
#   1. every ONNX fixture of the engine (old opsets, Tile, 3-D windows, training-mode
#      BatchNormalization, QDQ) through `isolane infer --backend cuda` at fp32 against the
#      onnxruntime output committed beside it;
#   2. the QDQ fixtures' GPU test (isolane-cuda's gpu::qdq_fixtures_run_on_the_gpu);
#   3. the interference prediction's matrix (scripts/predict-h200.sh matrix).
# Logs and a summary go to $OUT.
set -u
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/session19}
mkdir -p "$out"
# The staged binaries travel compressed (xz) where the tree leaves too little room.
for f in stage/*.xz stage/tests/*.xz; do
    [ -f "$f" ] && xz -d -f "$f" && chmod +x "${f%.xz}"
done
bin=$PWD/stage/isolane
{
    echo "## ONNX fixtures on cuda (fp32) against onnxruntime"
    for m in crates/isolane-engine/tests/fixtures/onnx/*.onnx crates/isolane-engine/tests/fixtures/onnx/qdq/*.onnx; do
        base=${m%.onnx}
        [ -f "$base.input.npy" ] && [ -f "$base.output.npy" ] || continue
        if "$bin" infer --model "$m" --backend cuda --precision fp32 --input "$base.input.npy" \
            --save-output /tmp/s19-out.npy >/tmp/s19-infer.log 2>&1; then
            python3 - "$base.output.npy" /tmp/s19-out.npy "$(basename "$base")" <<'PY'
import sys, numpy as np
want, got = np.load(sys.argv[1]).astype(np.float64), np.load(sys.argv[2]).astype(np.float64)
if want.size != got.size:
    print(f"FAIL {sys.argv[3]}: {got.shape} against {want.shape}"); sys.exit()
want, got = want.ravel(), got.ravel()
d = np.abs(want - got)
nan = np.isnan(want) != np.isnan(got)
rel = np.linalg.norm(np.nan_to_num(want - got)) / max(np.linalg.norm(np.nan_to_num(want)), 1e-30)
verdict = "ok" if not nan.any() and rel <= 1e-4 else "FAIL"
print(f"{verdict} {sys.argv[3]}: max |diff| {np.nanmax(d) if d.size else 0:.3g}, rel L2 {rel:.3g}")
PY
        else
            echo "REFUSED $(basename "$base"): $(tail -c 300 /tmp/s19-infer.log | tr '\n' ' ')"
        fi
    done
} 2>&1 | tee "$out/fixtures-cuda.txt" | tail -n 80
echo "=== gpu::qdq_fixtures_run_on_the_gpu"
stage/tests/isolane-cuda--gpu qdq_fixtures_run_on_the_gpu --ignored --test-threads=1 --nocapture \
    >"$out/qdq-gpu.log" 2>&1
tail -n 25 "$out/qdq-gpu.log"
if [ "${PREDICT:-1}" = 1 ]; then
    echo "=== predict-h200.sh matrix"
    OUT=$out ISOLANE_BIN=$bin timeout 330 bash scripts/predict-h200.sh matrix >"$out/predict.log" 2>&1
    tail -n 30 "$out/predict.log"
fi
