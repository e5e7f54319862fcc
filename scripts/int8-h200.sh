#!/usr/bin/env bash
# int8 and fp8 against fp16 on the H200 (issue 33, "Measure"), with the staged binaries
# (STAGE_PACKAGES="-p isolane-cuda -p isolane" scripts/gpu-test.sh stage; carry ["stage"]). Runs
# from the repository root on the GPU machine, under 5 minutes (a deadline, DEADLINE_S = 280,
# skips the rows left when it passes, saying so):
#   0. the correctness test of the tensor-core path, when its binary is staged
#      (stage/tests/isolane-cuda--gpu quant_gemm_path_matches_the_exact_reference_layer_by_layer:
#      every QuantGemm layer's error, cuBLASLt's candidates and choice, top-1), log in $OUT;
#   1. exports torchvision's resnet50, mobilenet_v2, convnext_base and vit_b_16 (seeded random
#      weights: the machine is offline) to ONNX with a dynamic batch and writes a calibration
#      folder of 8 .npy items (ORT=1: also onnxruntime's quantize_static QDQ models, slow);
#   2. runs each model alone, closed loop, at batch 1 and 64 (`isolane run`, one workload):
#        fp16        the float model at fp16
#        int8        precision = "int8", calibration = the folder (percentile): the quantized
#                    Conv/Linear products on cuBLASLt's int8 tensor-core GEMM (docs/cuda.md)
#        fp8         precision = "fp8" (minmax): the same on the e4m3 GEMM
#        ort-qdq     (ORT=1) onnxruntime's QDQ model at fp16
#   3. writes $OUT/int8.md: p50 latency (ms per job, host copies included) and throughput
#      (images/s) per row, the ratio to fp16, the calibration's top-1 agreement lines, and how
#      many products each model ran on the tensor-core path (the build's search log).
# Targets (issue 33): resnet50 int8 batch 1 <= 0.25 ms; int8 at batch 64 >= 1.6x fp16's
# throughput. Batch 1 rows run first; when the deadline leaves batch-64 rows out, a second
# call measures them: MODELS="convnext_base vit_b_16" BATCHES=64 TEST=0 bash scripts/int8-h200.sh
set -u
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/int8-h200}
mkdir -p "$out"
for f in stage/*.xz; do
    [ -f "$f" ] && xz -d -f "$f" && chmod +x "${f%.xz}"
done
bin=${ISOLANE_BIN:-$PWD/stage/isolane}
work=${WORK:-/tmp/isolane-int8}
models=${MODELS:-resnet50 mobilenet_v2 convnext_base vit_b_16}
batches=${BATCHES:-1 64}
variants=${VARIANTS:-fp16 int8 fp8}
deadline=$(($(date +%s) + ${DEADLINE_S:-280}))
mkdir -p "$work/cal"

t=stage/tests/isolane-cuda--gpu
if [ -e "$t.xz" ] && [ ! -e "$t" ]; then xz -d -f "$t.xz"; fi
if [ -e "$t" ] && [ "${TEST:-1}" = 1 ]; then
    chmod +x "$t"
    echo "=== the tensor-core path's correctness test"
    timeout 100 "$t" quant_gemm_path_matches_the_exact_reference_layer_by_layer --ignored \
        --nocapture >"$out/quant-gemm-test.log" 2>&1
    echo "test exit $?" | tee -a "$out/quant-gemm-test.log"
    grep -E "QuantGemm steps|compile failed|panicked|test result" "$out/quant-gemm-test.log"
fi

echo "=== export ($models)"
python3 - "$work" $models <<'PY' 2>&1 | tee "$out/export.log" | tail -n 20
import os, sys
import numpy as np
import torch, torchvision

work, names = sys.argv[1], sys.argv[2:]
rng = np.random.default_rng(0)
# Calibration items: ImageNet-normalised inputs are roughly N(0, 1) per channel.
items = [rng.standard_normal((3, 224, 224)).astype(np.float32) for _ in range(8)]
for i, x in enumerate(items):
    np.save(os.path.join(work, "cal", f"{i:02d}.npy"), x)
for name in names:
    torch.manual_seed(0)
    m = getattr(torchvision.models, name)(weights=None).eval()
    path = os.path.join(work, f"{name}.onnx")
    x = torch.from_numpy(items[0][None])
    kw = dict(opset_version=17, input_names=["x"], output_names=["y"],
              dynamic_axes={"x": {0: "N"}, "y": {0: "N"}})
    try:
        torch.onnx.export(m, x, path, dynamo=False, **kw)
    except TypeError:
        torch.onnx.export(m, x, path, **kw)
    print(f"{name}: exported {path}")
    if os.environ.get("ORT") != "1":
        continue
    try:
        from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                              quantize_static)
    except ImportError as e:
        print(f"{name}: no onnxruntime.quantization here ({e}); ort-qdq rows skipped")
        continue

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"x": v[None]} for v in items])

        def get_next(self):
            return next(self.it, None)

    qpath = os.path.join(work, f"{name}.qdq.onnx")
    quantize_static(path, qpath, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    print(f"{name}: quantize_static wrote {qpath}")
PY

# One closed-loop workload alone: prints "p50_ms throughput_ips" or "FAIL reason".
run_one() { # model_file batch precision extra_keys tag
    local dir="$work/runs/$5" scen="$work/$5.toml" jobs=300 left
    [ "$2" -gt 1 ] && jobs=40
    left=$((deadline - $(date +%s)))
    if [ "$left" -lt 20 ]; then
        echo "FAIL skipped: the script's deadline (DEADLINE_S) passed"
        return
    fi
    cat >"$scen" <<EOF
[device]
backend = "cuda"

[[workload]]
name = "m"
model = "$1"
batch = $2
precision = "$3"
$4
rate_hz = "max"
jobs = $jobs
warmup_jobs = 20
EOF
    rm -rf "$dir"
    [ "$left" -gt 120 ] && left=120
    if ISOLANE_CUDA_SEARCH_LOG=1 timeout "$left" "$bin" run "$scen" --out "$dir" --quiet >"$out/$5.log" 2>&1; then
        python3 - "$dir/summary.json" <<'PY'
import json, sys
w = json.load(open(sys.argv[1]))["workloads"][0]
print(f'{w["latency_ms"]["p50"]:.3f} {w["throughput_ips"]:.0f}')
PY
    else
        echo "FAIL $(tail -c 200 "$out/$5.log" | tr '\n' ' ')"
    fi
}

{
    echo "# int8 and fp8 against fp16 on the H200"
    echo
    echo "torchvision models with seeded random weights, one workload alone, closed loop;"
    echo "p50 latency per job (host copies included) and throughput. int8 / fp8: isolane's"
    echo "calibration (8 random-normal items) of the float model; the quantized Conv/Linear"
    echo "products on cuBLASLt's int8 / e4m3 tensor-core GEMMs, the rest fake-quant at fp16."
    echo
    echo "| model | batch | variant | p50 ms | images/s | vs fp16 throughput |"
    echo "| --- | ---: | --- | ---: | ---: | ---: |"
    # Every batch-1 row first: a batch-64 int8 / fp8 row calibrates 64 rows on the CPU's
    # reference interpreter (tens of seconds for convnext_base and vit_b_16), so the deadline
    # may leave some out; run those alone then (MODELS=... BATCHES=64).
    for b in $batches; do
        for m in $models; do
            fp16=""
            for v in $variants; do
                case $v in
                    fp16) r=$(run_one "$work/$m.onnx" "$b" fp16 "" "$m-b$b-$v") ;;
                    int8) r=$(run_one "$work/$m.onnx" "$b" int8 "calibration = \"$work/cal\"" "$m-b$b-$v") ;;
                    fp8) r=$(run_one "$work/$m.onnx" "$b" fp8 "calibration = \"$work/cal\"
calibration_method = \"minmax\"" "$m-b$b-$v") ;;
                    ort-qdq)
                        [ -f "$work/$m.qdq.onnx" ] || continue
                        r=$(run_one "$work/$m.qdq.onnx" "$b" fp16 "" "$m-b$b-$v") ;;
                esac
                case $r in
                    FAIL*) echo "| $m | $b | $v | ${r:0:120} | | |" ;;
                    *)
                        set -- $r
                        [ $v = fp16 ] && fp16=$2
                        ratio=""
                        [ -n "$fp16" ] && ratio=$(python3 -c "print(f'{$2 / $fp16:.2f}x')")
                        echo "| $m | $b | $v | $1 | $2 | $ratio |" ;;
                esac
            done
        done
    done
    echo
    echo "## isolane's calibration: top-1 agreement with fp32 over the calibration items"
    echo
    grep -h "calibration items" "$out"/*-int8.log "$out"/*-fp8.log 2>/dev/null | sed 's/^/    /'
    echo
    echo "## GEMMs on the tensor cores per run (search log: distinct shapes, and the first failure)"
    echo
    for f in "$out"/*-int8.log "$out"/*-fp8.log; do
        [ -f "$f" ] || continue
        n=$(grep -c -E "search: (int8|float8e4m3fn) gemm" "$f")
        e=$(grep -m1 -E "cuBLASLt offers no|no .* algorithm of cuBLASLt" "$f" | cut -c1-160)
        echo "    $(basename "$f" .log): $n GEMM shapes ${e:+; $e}"
    done
    if [ -f "$out/quant-gemm-test.log" ]; then
        echo
        echo "## The tensor-core path's correctness test"
        echo
        grep -E "QuantGemm steps|compile failed|on the tensor-core path|test result|exit" \
            "$out/quant-gemm-test.log" | sed 's/^/    /'
    fi
} >"$out/int8.md"
cat "$out/int8.md"
