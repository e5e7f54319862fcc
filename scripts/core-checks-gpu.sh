#!/usr/bin/env bash
# There (device run, carry ["stage"]): what issue 11 (the solid core) must show on the GPU after
# verify and maxrate moved onto the session library and the one worker protocol: the GPU tests
# of the gpu, session and telemetry crates, kill -9 leaves nothing (run and verify on MPS),
# verify on green, MPS and time-slicing, maxrate in an MPS client worker, and the GPU
# quickstart. Everything lands in $OUT/core-checks.tgz; the log is printed.
#   here:  STAGE_PACKAGES="-p isolane-cuda -p isolane-gpu -p isolane-session -p isolane-telemetry" \
#              bash scripts/gpu-test.sh stage
#   there: bash scripts/core-checks-gpu.sh
set -u
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/isolane-out}
work=/tmp/isolane-core-checks
mkdir -p "$out" "$work"
bin=stage/isolane
export ISOLANE_BIN="$PWD/$bin"
step() { echo; echo "=== $*"; }

step "GPU tests: isolane-gpu, isolane-session, isolane-telemetry"
OUT=$work bash scripts/gpu-test.sh run isolane-gpu--gpu isolane-session--gpu \
    isolane-telemetry--isolane_telemetry 2>&1 | grep -E '^(===|test |test result)|panicked|FAILED'

step "kill -9 of run and verify on MPS"
OUT=$work bash scripts/gpu-test.sh leaks 2>&1 | grep -E '^leaks'

for s in verify-green-4x32 verify-mps-4x25 verify-timeslice-4; do
    step "verify $s"
    timeout 120 "$bin" verify "crates/isolane-gpu/scenarios/$s.toml" --duration-s 1 --quiet -o "$work/$s" 2>&1 | tail -n 12
    echo "exit $?"
done

step "maxrate resnet18 fp16: green 64 SMs (in-process) and MPS 50 % (an isolane worker client)"
for m in "green --sms 64" "mps --thread-pct 50"; do
    name=$(echo "$m" | cut -d' ' -f1)
    # shellcheck disable=SC2086
    timeout 150 "$bin" maxrate --model resnet18 --backend cuda --precision fp16 --mechanism $m \
        --jobs 200 --validations 2 --relative-step 0.02 --out "$work/maxrate-$name" 2>&1 | tail -n 4
    echo "exit $?"
done
ps -eo pid,stat,args | awk '/nvidia-cuda-mps|isolane worker/ && !/awk/ && $2 !~ /^Z/' | grep . || echo "no MPS or worker process left"

step "quickstart (no scenario: the GPU quickstart)"
timeout 120 "$bin" run --quiet --out "$work/quickstart" 2>&1 | tail -n 12
echo "exit $?"

tar czf "$out/core-checks.tgz" -C "$work" --exclude='*.csv' .
