#!/usr/bin/env bash
# Saved plans on the GPU machine (issue 33): load time against build time, and bit-identical
# outputs of a loaded plan in 3 green partition sizes, under MPS and on the whole GPU.
# Staged build as scripts/gpu-test.sh makes it (STAGE_PACKAGES="-p isolane-cuda"; carry
# ["stage"]): stage/isolane and stage/tests/isolane-cuda--gpu. Under 4 minutes.
#
#   1. `isolane build M --precision fp16 --batch 1` for resnet50, mobilenet_v2, vit_b_16 (the
#      command's wall time: process start, weights, compile, timing and plan check), then
#      `isolane bench` of the built-in against the plan file (its compile_ms is the load's);
#   2. isolane-cuda's gpu::saved_plans_load_untimed_with_the_same_bits_in_every_green_size:
#      build time against load time in-process, and loads on the whole GPU and in green contexts
#      of 16, 64 and 128 SMs, each compared bit for bit with the built model;
#   3. the plan files of step 1 loaded as MPS clients at 25, 30 and 50 % of the threads
#      (gpu::saved_plans_from_files_load_here under an MPS daemon of this script's own), and run
#      by `isolane run` on the whole GPU (time-sliced) and as MPS workloads (a load checks the outputs' bits
#      of the check input against the build's and refuses a model that differs).
# Logs and saved-plan.md go to $OUT.
set -u
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/saved-plan}
mkdir -p "$out"
for f in stage/*.xz stage/tests/*.xz; do
    [ -f "$f" ] && xz -d -f "$f" && chmod +x "${f%.xz}"
done
bin=$PWD/stage/isolane
gpu_test=$PWD/stage/tests/isolane-cuda--gpu
plans=$(mktemp -d)
md=$out/saved-plan.md
models="resnet50 mobilenet_v2 vit_b_16"
{
    echo "# Saved plans on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
    echo
    echo "## 1. isolane build (fp16, batch 1): the command's wall time"
    echo
    echo "| model | build command (s) | file (MiB) |"
    echo "| --- | ---: | ---: |"
} >"$md"
for m in $models; do
    t0=$(date +%s.%N)
    if timeout 120 "$bin" build "$m" --precision fp16 --batch 1 -o "$plans/$m.isoplan" \
        >"$out/build-$m.log" 2>&1; then
        t1=$(date +%s.%N)
        size=$(stat -c %s "$plans/$m.isoplan")
        python3 -c "print('| $m | %.2f | %.1f |' % ($t1 - $t0, $size / 1048576))" >>"$md"
    else
        echo "| $m | FAILED: $(tail -c 200 "$out/build-$m.log" | tr '\n' ' ') | |" >>"$md"
    fi
done
{
    echo
    echo "## 1b. isolane bench: compile (built-in) against load (saved plan), fresh process each, fp16 batch 1"
    echo
    echo "| model | compile, built-in (ms) | load, saved plan (ms) | median job, built-in (ms) | median job, saved plan (ms) |"
    echo "| --- | ---: | ---: | ---: | ---: |"
} >>"$md"
for m in $models; do
    [ -f "$plans/$m.isoplan" ] || continue
    timeout 60 "$bin" bench --model "$m" --backend cuda --precision fp16 --replays 200 --json \
        >"$out/bench-$m.json" 2>"$out/bench-$m.err"
    timeout 60 "$bin" bench --model "$plans/$m.isoplan" --backend cuda --precision fp16 \
        --replays 200 --json >"$out/bench-$m-plan.json" 2>"$out/bench-$m-plan.err"
    python3 - "$m" "$out/bench-$m.json" "$out/bench-$m-plan.json" >>"$md" <<'PY'
import json, sys
def first(path):
    try:
        for line in open(path):
            line = line.strip()
            if line.startswith("{"):
                return json.loads(line)
    except OSError:
        pass
    return None
a, b = first(sys.argv[2]), first(sys.argv[3])
f = lambda r, k: f"{r[k]:.3f}" if r and k in r else "FAILED"
print(f"| {sys.argv[1]} | {f(a, 'compile_ms')} | {f(b, 'compile_ms')} | {f(a, 'median_ms')} | {f(b, 'median_ms')} |")
PY
done
{
    echo
    echo "## 2. In-process build vs load; whole GPU and green 16 / 64 / 128 SMs (bits against the built model)"
    echo
    echo '```'
} >>"$md"
timeout 150 "$gpu_test" saved_plans_load_untimed_with_the_same_bits_in_every_green_size \
    --ignored --test-threads=1 --nocapture >"$out/green.log" 2>&1
echo "exit code $?" >>"$out/green.log"
grep -E "^saved plan|panicked|exit code|test result" "$out/green.log" >>"$md"
echo '```' >>"$md"

{
    echo
    echo "## 3. The plan files loaded as MPS clients and run by isolane run"
    echo
    echo '```'
} >>"$md"
mps_dir=$(mktemp -d)
export CUDA_MPS_PIPE_DIRECTORY=$mps_dir/pipe CUDA_MPS_LOG_DIRECTORY=$mps_dir/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
if nvidia-cuda-mps-control -d; then
    for pct in 25 30 50; do
        CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$pct ISOLANE_SAVED_PLAN_DIR=$plans timeout 60 \
            "$gpu_test" saved_plans_from_files_load_here --ignored --test-threads=1 --nocapture \
            >"$out/mps-$pct.log" 2>&1
        echo "exit code $?" >>"$out/mps-$pct.log"
        grep -E "^saved plan|panicked|exit code" "$out/mps-$pct.log" >>"$md"
    done
    echo quit | nvidia-cuda-mps-control
    sleep 1
else
    echo "MPS daemon did not start (see $mps_dir/log)" >>"$md"
fi
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
# The same files as workloads of isolane run: the whole GPU time-sliced, then MPS shares
# (isolane's own daemon), each workload in a worker process. A load that computes other bits
# fails the run.
for mech in timeslice mps; do
    sc=$plans/run-$mech.toml
    {
        echo '[device]'
        echo 'backend = "cuda"'
        echo "mechanism = \"$mech\""
        echo 'host = "process"'
        for m in $models; do
            echo
            echo '[[workload]]'
            echo "name = \"$m\""
            echo "model = \"$plans/$m.isoplan\""
            echo 'precision = "fp16"'
            echo 'rate_hz = 50'
            echo 'duration_s = 2'
            [ "$mech" = mps ] && echo 'partition = { thread_pct = 30 }'
        done
    } >"$sc"
    timeout 90 "$bin" run "$sc" --out "$out/run-$mech" >"$out/run-$mech.log" 2>&1
    echo "isolane run, mechanism $mech: exit code $?" >>"$md"
    grep -iE "saved plan|error" "$out/run-$mech.log" | head -5 >>"$md"
done
echo '```' >>"$md"
rm -rf "$plans" "$mps_dir"
cat "$md"
