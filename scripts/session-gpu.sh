#!/usr/bin/env bash
# A session's GPU checks in few device calls (sessions 20 and 21): each named step runs under its
# own time limit, its log kept; $OUT gets steps.txt, each step's summary markdown, and steps.tgz
# (every log).
#
#   here:   STAGE_PACKAGES="-p isolane-cuda -p isolane" bash scripts/gpu-test.sh stage, then
#           xz the binaries that are carried (stage/isolane.xz, stage/tests/NAME.xz);
#           for serve steps: scripts/serve-bench.sh stage (stage-serve/)
#   device: (carry ["stage"] or ["stage-serve"])  bash scripts/session-gpu.sh STEP...
#
# Steps (each script's own header says what it measures):
#   saved     scripts/saved-plan-h200.sh: saved plans, load against build, bits across partitions
#   savedmps  scripts/saved-plan-mps-diag.sh: saved plans as MPS clients at 25/30/50 % (SM count
#             pinned, session 23), in run, and built at 30 % then loaded on the whole GPU
#   l2        isolane-cuda's GPU test: weights kept in the L2 change no output
#   int8test  isolane-cuda's GPU test: calibrated int8/fp8 models run on the GPU
#   slots     isolane-cuda's GPU tests of the input slots: each job its own output, and an input
#             copied in place from page-locked host memory (a served shm region) bit-identical;
#             isolane-gpu's host_pin tests (pages locked and unlocked); stage with
#             STAGE_PACKAGES="-p isolane-cuda -p isolane-gpu -p isolane"
#   cudagpu   every GPU test of isolane-cuda's tests/gpu.rs (--ignored, one thread)
#   cudalib   the other GPU tests of isolane-cuda and isolane-gpu (lib and suite, --ignored)
#   hf        scripts/hf_models.py: Hugging Face vision models exported there (dynamo and classic)
#             through `isolane infer --backend cuda` at fp32 and fp16, against onnxruntime
#   quick     the README's main job: `isolane run` on the built-in quickstart, then `report`
#   quantgemm isolane-cuda's GPU test: the int8/fp8 tensor-core path against the exact reference
#   quantgraph isolane-cuda's GPU test: cuDNN's fused quantized convolution graph forced where
#             cuDNN makes a plan, against the exact reference (layers kept, engines, reasons)
#   quantchain isolane-cuda's GPU test: the timed choice (per layer, then the chain timed whole)
#             against the exact reference; the search log's chain line (both times, kept)
#   quantprobe isolane-cuda's GPU unit test: which fused quantized graphs cuDNN plans here
#             (resnet50's shapes, each epilogue, precompiled / runtime-compiled engines)
#   int8      scripts/int8-h200.sh: fp16 against int8 and fp8 (needs torch there)
#   int8acc   scripts/int8_accuracy_gpu.py: the trained digits CNN's top-1 accuracy and agreement
#             with fp32 per precision, cuda and cpu (isolane's calibration, onnxruntime's QDQ)
#   plans     scripts/predict-h200.sh plans (SCENARIOS=... to pick): the first plan's hit rate
#   plans-1, plans-2  the same in two calls of under 5 minutes (batch-1 scenarios, then the
#             batched ones); before plans-2, extract plans-1's predict.tar.gz (from steps.tgz)
#             in the repository so that its profiles and verdicts travel
#   qop       scripts/qop-h200.sh: QOperator fixtures on cuda against the CPU and onnxruntime
#   onepath   scripts/one-run-path-h200.sh: run and serve --release through one session
#   apps      the apps GPU test: an app in a green context, with its trace
#   levers-a, levers-b, levers-c   scripts/levers-h200.sh's trios (green, both deadlines, 3 repeats)
#   levers-mps   trio a under MPS
#   sms       a green partition resized while serving (scripts/mps_resize_check.py --key sms)
#   replan    scripts/replan-h200.sh run: fixed, ctl and --autoplan under a changing load
#   overhead  scripts/serve-bench.sh run --steps inproc,overhead,floor (the protocol floor in place
#             of the spin A/B, measured in session 21, to stay within the step's 300 s)
set -u
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu-steps}
work=/tmp/gpu-steps-work
mkdir -p "$out" "$work"
for f in stage/isolane.xz stage/tests/*.xz; do
    [ -e "$f" ] && xz -d -f "$f"
done
[ -d stage ] && chmod +x stage/isolane stage/tests/* 2>/dev/null
isolane=$PWD/stage/isolane
if [ ! -x "$isolane" ] && [ -e stage-serve/isolane.xz ]; then
    xz -dc stage-serve/isolane.xz >"$work/isolane" && chmod +x "$work/isolane"
    isolane=$work/isolane
fi
# The staged integration tests run this binary (tests/common's ISOLANE_BIN).
export ISOLANE_BIN=$isolane
site() {
    if [ -e stage-serve/site.tar.xz ] && [ ! -d "$work/site" ]; then
        mkdir -p "$work/site" && tar xJf stage-serve/site.tar.xz -C "$work/site"
    fi
    export PYTHONPATH=$work/site${PYTHONPATH:+:$PYTHONPATH}
}
step() {
    local name=$1 limit=$2 start rc
    shift 2
    start=$(date +%s)
    timeout "$limit" "$@" >"$work/$name.log" 2>&1
    rc=$?
    echo "$name: exit $rc, $(($(date +%s) - start)) s" | tee -a "$out/steps.txt"
    tail -5 "$work/$name.log"
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader >"$out/gpu.txt" 2>&1
for s in "$@"; do
    case $s in
    saved) step saved 270 env OUT="$work/saved" ISOLANE_BIN="$isolane" bash scripts/saved-plan-h200.sh ;;
    savedmps) step savedmps 270 env OUT="$work/savedmps" ISOLANE_BIN="$isolane" bash scripts/saved-plan-mps-diag.sh ;;
    l2) step l2 150 stage/tests/isolane-cuda--gpu weights_kept_in_the_l2_change_no_output --ignored --nocapture ;;
    int8test) step int8test 150 stage/tests/isolane-cuda--gpu calibrated_int8_and_fp8_models_run_on_the_gpu --ignored --nocapture ;;
    slots) step slots 240 bash -c 'stage/tests/isolane-cuda--isolane_cuda model::slots::tests --ignored --test-threads 1 --nocapture && stage/tests/isolane-gpu--isolane_gpu host_pin --nocapture' ;;
    cudagpu) step cudagpu 420 stage/tests/isolane-cuda--gpu --ignored --test-threads 1 ;;
    cudalib) step cudalib 200 bash -c 'for t in stage/tests/isolane-cuda--isolane_cuda stage/tests/isolane-cuda--suite stage/tests/isolane-gpu--*; do echo "== $t"; "$t" --ignored --test-threads 1 --skip on_another_gpu || rc=1; done; exit ${rc:-0}' ;;
    hf) step hf 290 python3 scripts/hf_models.py --isolane "$isolane" --backend cuda --precisions fp32,fp16 \
        --work "$work/hf" --out "$work/hf/hf.md" --jsonl "$work/hf/rows.jsonl" --budget-s 230 ;;
    quick) step quick 120 bash -c "\"$isolane\" run --out $work/quick-run && \"$isolane\" report $work/quick-run | tail -20" ;;
    quantgemm) step quantgemm 200 stage/tests/isolane-cuda--gpu quant_gemm_path_matches_the_exact_reference_layer_by_layer --ignored --nocapture ;;
    quantprobe)
        step quantprobe 150 stage/tests/isolane-cuda--isolane_cuda which_quantized_graphs_cudnn_plans_on_this_gpu --ignored --nocapture
        grep -E " rtc |graphs planned|test result|panicked" "$work/quantprobe.log" | cut -c1-400 |
            head -80 | tee "$out/quantprobe.md"
        ;;
    quantchain)
        step quantchain 200 env ISOLANE_CUDA_SEARCH_LOG=1 stage/tests/isolane-cuda--gpu quant_chosen_chain_matches_the_exact_reference_layer_by_layer --ignored --nocapture
        grep -E "kept per layer|QuantGemm steps|compile failed|note: cuDNN|quantized chain|quantized copies|graph writing y and its bytes|test result|panicked" \
            "$work/quantchain.log" | cut -c1-300 | head -60 | tee "$out/quantchain.md"
        ;;
    quantgraph)
        step quantgraph 200 env ISOLANE_CUDA_SEARCH_LOG=1 stage/tests/isolane-cuda--gpu quant_graph_path_matches_the_exact_reference_layer_by_layer --ignored --nocapture
        grep -E "kept per layer|QuantGemm steps|compile failed|note: cuDNN|cudnn [a-z0-9]+ graph( writing y and its bytes)? for|test result" \
            "$work/quantgraph.log" | cut -c1-300 | head -60 | tee "$out/quantgraph.md"
        ;;
    plans) step plans 560 env OUT="$work/plans" ISOLANE_BIN="$isolane" bash scripts/predict-h200.sh plans ;;
    plans-1 | plans-2)
        p=scenarios/planner
        sc="$p/robot-arm.toml $p/endoscopy.toml $p/edge-box.toml $p/three-cameras.toml"
        [ "$s" = plans-2 ] && sc="$p/image-service.toml $p/heavy-inspection.toml $p/inspection-line.toml $p/batch-inspection.toml"
        step "$s" 300 env OUT="$work/$s" ISOLANE_BIN="$isolane" SCENARIOS="$sc" PROFILE_JOBS=500 \
            TIME_BUDGET_S=200 CALL_LIMIT_S=280 bash scripts/predict-h200.sh plans
        ;;
    qop) step qop 90 env OUT="$work/qop" ISOLANE_BIN="$isolane" bash scripts/qop-h200.sh ;;
    onepath) step onepath 300 env OUT="$work/onepath" ISOLANE_BIN="$isolane" bash scripts/one-run-path-h200.sh ;;
    int8) step int8 300 env OUT="$work/int8" ISOLANE_BIN="$isolane" bash scripts/int8-h200.sh ;;
    int8acc) step int8acc 150 python3 scripts/int8_accuracy_gpu.py --isolane "$isolane" --out "$work/int8acc" ;;
    apps) step apps 150 stage/tests/isolane--apps an_app_runs_in_a_green_context_on_the_gpu --ignored --nocapture ;;
    levers-a | levers-b | levers-c) step "$s" 300 env OUT="$work/$s" ISOLANE_BIN="$isolane" bash scripts/levers-h200.sh "${s#levers-}" ;;
    levers-mps) step "$s" 300 env OUT="$work/$s" ISOLANE_BIN="$isolane" MECHANISMS=mps bash scripts/levers-h200.sh a ;;
    sms)
        site
        step sms 150 python3 scripts/mps_resize_check.py --isolane "$isolane" \
            --scenario scenarios/serve/h200.toml --model mobilenet_v2 --key sms --to 16 --over 128
        ;;
    replan) step replan 440 env OUT="$work/replan" ISOLANE="$isolane" bash scripts/replan-h200.sh run ;;
    overhead) step overhead 300 env OUT="$work/overhead" ISOLANE="$isolane" bash scripts/serve-bench.sh run --steps inproc,overhead,floor --ab-spin-us '' ;;
    *) echo "unknown step $s" | tee -a "$out/steps.txt" ;;
    esac
done
# Each step's summary beside the tarball (at most 8 files come back).
for md in "$work"/*/*.md; do
    [ -e "$md" ] && cp "$md" "$out/$(basename "$(dirname "$md")")-$(basename "$md")"
done 2>/dev/null
ls "$out" | head -20
cp /tmp/mps-resize-server.log "$work/" 2>/dev/null
tar czf "$out/steps.tgz" -C "$work" --exclude=site --exclude=isolane --exclude="*.onnx" --exclude="*.onnx.data" --exclude="*.npy" . 2>/dev/null
ls -la "$out"
