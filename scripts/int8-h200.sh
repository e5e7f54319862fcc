#!/usr/bin/env bash
# int8 and fp8 against fp16 on the H200 (issue 33, "Measure"), with the staged binaries
# (STAGE_PACKAGES="-p isolane-cuda -p isolane" scripts/gpu-test.sh stage; carry ["stage"]). Runs
# from the repository root on the GPU machine, under 5 minutes (a deadline, DEADLINE_S = 280,
# skips the rows left when it passes, saying so):
#   0. the correctness test of the tensor-core path, when its binary is staged and TEST is not 0
#      (stage/tests/isolane-cuda--gpu quant_gemm_path_matches_the_exact_reference_layer_by_layer:
#      every QuantGemm layer's error, cuBLASLt's candidates and choice, top-1), log in $OUT;
#   1. writes a calibration folder of 8 random-normal .npy items (numpy);
#   2. `isolane bench` of resnet50, mobilenet_v2, convnext_base and vit_b_16 (built-in, seeded
#      synthetic weights) at batch 1 and 64, --precision fp16,int8,fp8 --calibration the folder
#      (int8 by percentile, fp8 by min-max: one bench call each): p50 latency per job (host
#      copies included) and throughput; int8 / fp8 run the quantized Conv/Linear products on
#      cuBLASLt's int8 / e4m3 tensor-core GEMMs (docs/cuda.md), the rest fake-quant at fp16;
#   3. writes $OUT/int8.md: the table with each row's ratio to fp16's throughput, the
#      calibration's top-1 agreement lines, how many GEMM shapes each build put on the tensor
#      cores (the search log), and the test's summary.
# Targets (issue 33): resnet50 int8 batch 1 <= 0.25 ms; int8 at batch 64 >= 1.6x fp16's
# throughput. Batch 1 rows run first: a batch-64 int8 / fp8 row calibrates 64 rows on the CPU's
# reference interpreter (tens of seconds for convnext_base and vit_b_16), so the deadline may
# leave some out; a second call measures them:
#   MODELS="convnext_base vit_b_16" BATCHES=64 TEST=0 bash scripts/int8-h200.sh
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
deadline=$(($(date +%s) + ${DEADLINE_S:-280}))
mkdir -p "$work/cal" "$work/rows"

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

python3 - "$work/cal" <<'PY'
import os, sys
import numpy as np
rng = np.random.default_rng(0)
# ImageNet-normalised inputs are roughly N(0, 1) per channel.
for i in range(8):
    np.save(os.path.join(sys.argv[1], f"{i:02d}.npy"), rng.standard_normal((3, 224, 224)).astype(np.float32))
PY

# One bench call: prints its JSON lines into $work/rows/TAG.jsonl, its log into $out/TAG.log.
bench() { # model batch precisions method tag
    local left=$((deadline - $(date +%s))) jobs=300
    [ "$2" -gt 1 ] && jobs=40
    if [ "$left" -lt 20 ]; then
        echo "{\"model\":\"$1\",\"batch\":$2,\"precision\":\"$3\",\"skipped\":\"the deadline (DEADLINE_S) passed\"}" \
            >"$work/rows/$5.jsonl"
        return
    fi
    [ "$left" -gt 150 ] && left=150
    local cal=()
    [ "$3" != fp16 ] && cal=(--calibration "$work/cal" --calibration-method "$4")
    ISOLANE_CUDA_SEARCH_LOG=1 timeout "$left" "$bin" bench --backend cuda --model "$1" \
        --batch "$2" --precision "$3" "${cal[@]}" --replays "$jobs" --warmup 20 --json \
        >"$work/rows/$5.jsonl" 2>"$out/$5.log"
    local rc=$?
    if [ $rc -ne 0 ]; then
        echo "{\"model\":\"$1\",\"batch\":$2,\"precision\":\"$3\",\"failed\":\"exit $rc: $(tail -c 300 "$out/$5.log" | tr '\n"\\' '   ')\"}" \
            >>"$work/rows/$5.jsonl"
    fi
}

order=()
for b in $batches; do
    for m in $models; do
        bench "$m" "$b" fp16 percentile "$m-b$b-fp16"
        bench "$m" "$b" int8 percentile "$m-b$b-int8"
        bench "$m" "$b" fp8 minmax "$m-b$b-fp8"
        order+=("$m-b$b-fp16" "$m-b$b-int8" "$m-b$b-fp8")
    done
done

{
    echo "# int8 and fp8 against fp16 on the H200"
    echo
    echo "\`isolane bench --backend cuda\`: built-in models with seeded synthetic weights, median"
    echo "latency per job (host copies included) and throughput. int8 / fp8: isolane's"
    echo "calibration (8 random-normal items; int8 percentile, fp8 min-max) of the float model;"
    echo "each quantized Conv/Linear product runs the fastest (timed at build) of cuBLASLt's int8 /"
    echo "e4m3 tensor-core GEMM, cuDNN's int8 convolution (int8, not 1x1), the float step with its"
    echo "fake-quant values at fp16 and cuDNN's fused quantized graph (docs/cuda.md); the rest"
    echo "fake-quant at fp16."
    echo
    echo "The plan column: which plan a calibrated row ran, its quantized one or its fp16 fallback"
    echo "(the faster forward, timed whole at build: bench's plan_kept; docs/cuda.md, \"The whole"
    echo "model against its float plan\"), with both forwards in ms."
    echo
    echo "| model | batch | precision | median ms | images/s | vs fp16 throughput | plan (quantized / fp16 forward ms) |"
    echo "| --- | ---: | --- | ---: | ---: | ---: | --- |"
    python3 - "$work/rows" "${order[@]}" <<'PY'
import json, os, sys
rows, fp16 = sys.argv[1], {}
for tag in sys.argv[2:]:
    path = os.path.join(rows, tag + ".jsonl")
    lines = [l for l in open(path)] if os.path.exists(path) else []
    got = False
    for line in lines:
        try:
            r = json.loads(line)
        except ValueError:
            continue
        got = True
        key = (r["model"], r["batch"])
        if "median_ms" not in r:
            why = r.get("failed") or r.get("skipped") or "?"
            print(f'| {r["model"]} | {r["batch"]} | {r["precision"]} | {why[:160]} | | | |')
            continue
        if r["precision"] == "fp16":
            fp16[key] = r["throughput_ips"]
        ratio = f'{r["throughput_ips"] / fp16[key]:.2f}x' if key in fp16 else ""
        plan = ""
        if "plan_kept" in r:
            plan = f'{r["plan_kept"]} ({r["quantized_forward_ms"]:.3f} / {r["float_forward_ms"]:.3f})'
        print(f'| {r["model"]} | {r["batch"]} | {r["precision"]} | {r["median_ms"]:.3f} '
              f'| {r["throughput_ips"]:.0f} | {ratio} | {plan} |')
    if not got:
        print(f"| {tag} | | | no output | | | |")
PY
    echo
    echo "## isolane's calibration: top-1 agreement with fp32 over the calibration items"
    echo
    grep -h "calibration items" "$out"/*-int8.log "$out"/*-fp8.log 2>/dev/null | sed 's/^/    /'
    echo
    echo "## Per build: GEMM shapes on the tensor cores, the quantized layers' kept paths (search"
    echo "## log: int8 GEMM / cuDNN int8 conv / float / cuDNN quantized graph), and the first failure"
    echo
    for f in "$out"/*-int8.log "$out"/*-fp8.log; do
        [ -f "$f" ] || continue
        n=$(grep -c -E "search: (int8|float8e4m3fn) gemm" "$f")
        g=$(grep -c -E "search: quantized .*kept (int8|float8e4m3fn) gemm" "$f")
        d=$(grep -c -E "search: quantized .*kept cudnn [a-z0-9]+ conv" "$f")
        fl=$(grep -c -E "search: quantized .*kept float" "$f")
        gr=$(grep -c -E "search: quantized .*kept cudnn [a-z0-9]+ graph" "$f")
        e=$(grep -m1 -E "cuBLASLt offers no|algorithm of cuBLASLt|error|panicked" "$f" | cut -c1-200)
        echo "    $(basename "$f" .log): $n GEMM shapes; kept $g gemm / $d cudnn conv / $fl float / $gr cudnn graph${e:+; $e}"
        # cuDNN's fused quantized graphs: plans made (one per layer shape) and the time their
        # making took (runtime-compiled engines compile here), or why cuDNN made none.
        gp=$(grep -c -E "search: cudnn [a-z0-9]+ graph( writing y and its bytes)? for .*: engine" "$f")
        gms=$(grep -o -E "graph( writing y and its bytes)? for .* made in [0-9.]+ ms" "$f" |
            grep -o -E "[0-9.]+ ms$" | awk '{s += $1} END {printf "%.0f", s}')
        rtc=$(grep -c -E "graph( writing y and its bytes)? for .*compiled at run time" "$f")
        note=$(grep -m1 "note: cuDNN's fused" "$f" | cut -c1-300)
        echo "      cudnn graph plans: $gp ($rtc runtime-compiled), made in ${gms:-0} ms${note:+; $note}"
        # Graphs that write a block's output twice (fp16 for the residual, bytes for the next
        # convolution): planned, or not (then a quantize kernel follows the graph).
        two=$(grep -c -E "graph writing y and its bytes for .*: engine" "$f")
        two_no=$(grep -c -E "graph writing y and its bytes for .*: none" "$f")
        why=$(grep -m1 -E "graph writing y and its bytes for .*: none" "$f" | cut -c1-300)
        echo "      graphs writing y and its bytes: $two planned, $two_no not${why:+ ($why)}"
        # The whole-model comparison: per-layer picks against the graph chain, both timed.
        chain=$(grep -m1 -E "search: quantized (chain|copies)" "$f" | cut -c1-400)
        echo "      ${chain:-no whole-model comparison (no graph lost a layer alone)}"
    done
    echo
    echo "## Each quantized layer's candidates and choice, resnet50 int8 (search log)"
    echo
    for f in "$out"/resnet50-b*-int8.log; do
        [ -f "$f" ] || continue
        echo "    $(basename "$f" .log):"
        grep -E "search: quantized" "$f" | cut -c1-400 | sed 's/^/      /'
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
