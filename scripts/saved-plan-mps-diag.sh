#!/usr/bin/env bash
# Saved plans as MPS clients (issue 33). Session 22: a plan built on the whole GPU computed
# other bits at 30 % of the threads (25 and 50 % matched), the same in a lone process, in three
# at once and in `isolane run`: the SM share, not the run path. Since session 23 a load tells
# cuBLASLt's matmuls (and cuDNN's heuristics) the SM count the build saw (docs/cuda.md, Saved
# plans); this measures whether that gives the built bits:
#   a. one test process per share, MPS 25 / 30 / 50 %, loads the three plans;
#   b. three test processes at once, MPS 30 % each (an order-dependent reduction would show);
#   c. `isolane run`, MPS, one workload (resnet50) at 30 %;
#   d. `isolane run`, MPS, the three workloads at 30 %;
#   e. d with ISOLANE_CUDA_SEARCH=timed (the worker's build options as outside MPS);
#   f. the other way round: resnet50 built as an MPS client at 30 %, loaded on the whole GPU.
# A load that still computes other bits says so with both SM counts, and the test then shows
# what run and serve do with it (load_saved_or_build: built again here).
# Staged as scripts/saved-plan-h200.sh (stage/isolane, stage/tests/isolane-cuda--gpu); about
# 3 minutes; writes $OUT/saved-plan-mps-diag.md and the logs.
set -u
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/saved-plan-mps-diag}
mkdir -p "$out"
for f in stage/*.xz stage/tests/*.xz; do
    [ -f "$f" ] && xz -d -f "$f" && chmod +x "${f%.xz}"
done
bin=${ISOLANE_BIN:-$PWD/stage/isolane}
gpu_test=$PWD/stage/tests/isolane-cuda--gpu
plans=$(mktemp -d)
md=$out/saved-plan-mps-diag.md
models="resnet50 mobilenet_v2 vit_b_16"
echo "# Saved plans under MPS: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)" >"$md"
for m in $models; do
    timeout 120 "$bin" build "$m" --precision fp16 --batch 1 -o "$plans/$m.isoplan" \
        >"$out/build-$m.log" 2>&1 || echo "build $m failed: $(tail -c 300 "$out/build-$m.log")" >>"$md"
done
mps_dir=$(mktemp -d)
export CUDA_MPS_PIPE_DIRECTORY=$mps_dir/pipe CUDA_MPS_LOG_DIRECTORY=$mps_dir/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
if ! nvidia-cuda-mps-control -d; then
    echo "MPS daemon did not start" >>"$md"
    exit 1
fi
load() { # $1: log name, $2: thread percentage
    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=${2:-30} ISOLANE_SAVED_PLAN_DIR=$plans timeout 90 \
        "$gpu_test" saved_plans_from_files_load_here --ignored --test-threads=1 --nocapture \
        >"$out/$1.log" 2>&1
    echo "exit code $?" >>"$out/$1.log"
}
{
    echo
    echo "## a. one test process per share: 25, 30, 50 %"
    echo '```'
} >>"$md"
for pct in 25 30 50; do
    load "a-$pct" "$pct"
    grep -E "^saved plan|panicked|exit code" "$out/a-$pct.log" | sed "s/^/$pct %: /" >>"$md"
done
echo '```' >>"$md"
{
    echo
    echo "## b. three test processes at once, 30 % each"
    echo '```'
} >>"$md"
load b1 &
load b2 &
load b3 &
wait
for k in 1 2 3; do grep -E "^saved plan|exit code" "$out/b$k.log" | sed "s/^/b$k: /" >>"$md"; done
echo '```' >>"$md"
# f (first half): resnet50 built as an MPS client at 30 %, loaded on the whole GPU below.
mps_plans=$(mktemp -d)
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30 timeout 120 "$bin" build resnet50 --precision fp16 \
    --batch 1 -o "$mps_plans/resnet50-mps30.isoplan" >"$out/build-mps30.log" 2>&1
build_mps_rc=$?
echo quit | nvidia-cuda-mps-control
sleep 1
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
scenario() { # $1 file, $2.. models
    local f=$1
    shift
    {
        printf '[device]\nbackend = "cuda"\nmechanism = "mps"\nhost = "process"\n'
        for m in "$@"; do
            printf '\n[[workload]]\nname = "%s"\nmodel = "%s"\nprecision = "fp16"\nrate_hz = 50\nduration_s = 2\npartition = { thread_pct = 30 }\n' \
                "$m" "$plans/$m.isoplan"
        done
    } >"$f"
}
runs() { # $1 label, $2 scenario, env...
    local label=$1 sc=$2
    shift 2
    env "$@" timeout 90 "$bin" run "$sc" --out "$out/run-$label" >"$out/run-$label.log" 2>&1
    local rc=$?
    {
        echo
        echo "## $label (exit code $rc)"
        echo '```'
        grep -iE "saved plan|error|failed" "$out/run-$label.log" | head -6
        echo '```'
    } >>"$md"
}
scenario "$plans/one.toml" resnet50
scenario "$plans/three.toml" $models
runs "c. isolane run, MPS, resnet50 alone" "$plans/one.toml"
runs "d. isolane run, MPS, three workloads" "$plans/three.toml"
runs "e. d with ISOLANE_CUDA_SEARCH=timed" "$plans/three.toml" ISOLANE_CUDA_SEARCH=timed
{
    echo
    echo "## f. resnet50 built as an MPS client at 30 % (exit code $build_mps_rc), loaded on the whole GPU"
    echo '```'
} >>"$md"
if [ "$build_mps_rc" = 0 ]; then
    ISOLANE_SAVED_PLAN_DIR=$mps_plans timeout 90 "$gpu_test" saved_plans_from_files_load_here \
        --ignored --test-threads=1 --nocapture >"$out/f.log" 2>&1
    echo "exit code $?" >>"$out/f.log"
    grep -E "^saved plan|panicked|exit code" "$out/f.log" >>"$md"
else
    tail -c 400 "$out/build-mps30.log" >>"$md"
fi
echo '```' >>"$md"
rm -rf "$plans" "$mps_dir" "$mps_plans"
cat "$md"
