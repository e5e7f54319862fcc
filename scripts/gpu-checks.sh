#!/usr/bin/env bash
# End-to-end checks on the GPU machine of what unit tests cannot show: runs of real models in
# each kind of partition (issue 5), MPS clean-up after a run and after SIGINT, telemetry and its
# CPU cost, a partition sweep and max rates in partitions (issue 6), and a report over them.
#
#   here:   STAGE_PACKAGES="-p isolane-telemetry" bash scripts/gpu-test.sh stage
#   device: (carry ["stage"])  bash scripts/gpu-checks.sh
#
# Everything lands in $OUT (default /tmp/isolane-checks); the log says what each step printed.
set -u
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/isolane-checks}
mkdir -p "$out"
bin=${ISOLANE_BIN:-stage/isolane}

mps_left() {
    # Our daemons run with a private pipe directory under $TMPDIR/isolane-mps-*.
    # A zombie ("Z": exited, waiting for the container's init to reap it) is not running.
    ps -eo pid,stat,args | awk '/nvidia-cuda-mps/ && !/awk/ && $2 !~ /^Z/' | grep . || echo "no MPS process left"
    ls -d "${TMPDIR:-/tmp}"/isolane-mps-* 2>/dev/null || echo "no isolane-mps directory left"
}

step() { echo; echo "=== $*"; }

for s in timeslice-2-resnet18 green-2x64-resnet18 mps-4x25-resnet18; do
    step "run $s"
    "$bin" run "scenarios/gpu/$s.toml" --out "$out/$s" --quiet
    echo "exit $?"
    mps_left
done

step "SIGINT in the middle of an MPS run"
sed 's/duration_s = 5/duration_s = 30/' scenarios/gpu/mps-4x25-resnet18.toml >"$out/mps-long.toml"
"$bin" run "$out/mps-long.toml" --out "$out/mps-sigint" --quiet &
pid=$!
sleep 12
kill -INT "$pid"
wait "$pid"
echo "exit $? (130 = interrupted, results written)"
sleep 1
mps_left
python3 - "$out/mps-sigint/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print("interrupted:", s.get("interrupted"), {w["name"]: w["metrics"]["jobs"] if "metrics" in w else w.get("jobs") for w in s["workloads"]})
PY

step "telemetry sampler on this GPU (its CPU cost)"
for t in stage/tests/isolane-telemetry--*; do
    [ -x "$t" ] && "$t" --ignored --test-threads=1 --nocapture 2>&1 | tail -n 25
done

step "max stable rate of resnet18 fp16: whole GPU, green 64 SMs, MPS 50 %"
for m in "timeslice" "green --sms 64" "mps --thread-pct 50"; do
    name=$(echo "$m" | cut -d' ' -f1)
    # shellcheck disable=SC2086
    "$bin" maxrate --model resnet18 --backend cuda --precision fp16 --mechanism $m \
        --jobs 200 --validations 2 --relative-step 0.02 --out "$out/maxrate-resnet18-$name" | tail -n 3
done
mps_left

step "partition sweep: convnext_large fp16 in green contexts"
"$bin" sweep partition --model convnext_large --mechanism green --precision fp16 \
    --sizes 8,16,32,64,128 --duration-s 2 --warmup 10 --out "$out/sweep-green-convnext_large" --quiet
echo "exit $?"

step "report"
dirs=()
for d in "$out"/*/; do [ -f "$d/summary.json" ] || [ -f "$d/sweep.json" ] || [ -f "$d/maxrate.json" ] && dirs+=("$d"); done
"$bin" report "${dirs[@]}" --out "$out/report.html"
echo "exit $?"
