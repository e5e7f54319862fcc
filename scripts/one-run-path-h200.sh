#!/usr/bin/env bash
# Issue 32's one run path on the GPU: `isolane run` and `isolane serve --release` release their
# fixed-rate workloads through the same session handle (isolane_runtime::coordinator::Releasing)
# and place them in their partitions through the same isolane_session::in_partitions. This
# checks, on the H200, what the CPU tests cannot: a released workload in a green partition
# (thread host) and in an MPS share (an `isolane worker` process adopted by the MPS session),
# beside the models served, and the same scenario through `isolane run`.
#
#   here:   STAGE_PACKAGES="-p isolane" bash scripts/gpu-test.sh stage (stage/isolane), or
#           scripts/serve-bench.sh stage (stage-serve/isolane.xz)
#   device: (carry ["stage"] or ["stage-serve"], timeout_s 400)  bash scripts/one-run-path-h200.sh
#
# Steps, each with scenarios/serve/h200.toml (green) or h200-mps.toml (MPS), mobilenet_v2
# critical at 200 Hz for 10 s (2000 jobs), resnet50 and vit_b_16 best effort:
#   run     `isolane run` of the green scenario: exit code, mobilenet_v2's jobs and timeouts
#   green   `serve --release mobilenet_v2 --out` on the green scenario, the other two served
#           (idle): the released line, jobs/mobilenet_v2.csv's rows, and /metrics'
#           isolane_serve_released_jobs_total scraped after the schedule's end
#   mps     the same on the MPS scenario (the released workload in a worker process)
# $OUT/summary.md has one row per step; $OUT/logs.tgz every log. About 2-3 minutes (three
# starts that build three fp16 models each). ISOLANE_BIN overrides the staged binary;
# GREEN, MPS and RELEASED the scenarios and the released workload (the script's own check on
# a CPU machine: GREEN=MPS=scenarios/serve/cpu-spin.toml RELEASED=critical).
set -u
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/one-run-path}
work=/tmp/one-run-path-work
rm -rf "$work" && mkdir -p "$out" "$work"
isolane=${ISOLANE_BIN:-}
if [ -z "$isolane" ]; then
    if [ -e stage/isolane.xz ]; then
        xz -dc stage/isolane.xz >"$work/isolane"
    elif [ -e stage/isolane ]; then
        cp stage/isolane "$work/isolane"
    elif [ -e stage-serve/isolane.xz ]; then
        xz -dc stage-serve/isolane.xz >"$work/isolane"
    else
        echo "no staged isolane (stage/isolane[.xz] or stage-serve/isolane.xz)" >&2
        exit 2
    fi
    chmod +x "$work/isolane"
    isolane=$work/isolane
fi
green=${GREEN:-scenarios/serve/h200.toml}
mps=${MPS:-scenarios/serve/h200-mps.toml}
w=${RELEASED:-mobilenet_v2}
summary=$out/summary.md
{
    echo "# One run path on the GPU ($(date -u +%FT%TZ))"
    echo
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | sed 's/^/GPU: /'
    echo
    echo "Scenarios: run and green \`$green\`, mps \`$mps\`; released: \`$w\`"
    echo
    echo "| step | exit | released / run line | jobs CSV rows | /metrics released_jobs_total |"
    echo "| --- | --- | --- | --- | --- |"
} >"$summary"

# `isolane run`: the session whose every workload is released.
timeout 120 "$isolane" run "$green" --out "$work/run" >"$work/run.log" 2>&1
rc=$?
jobs=$(python3 - "$work/run/summary.json" "$w" <<'EOF' 2>/dev/null
import json, sys
s = json.load(open(sys.argv[1]))
w = next(w for w in s["workloads"] if w["name"] == sys.argv[2])
print(f'{w["name"]}: {w["jobs"]} jobs, {w["timeouts"]} timeouts')
EOF
)
rows=$(($(wc -l <"$work/run/jobs/$w.csv" 2>/dev/null || echo 1) - 1))
echo "| run | $rc | ${jobs:-no summary.json} | $rows | - |" >>"$summary"

# `serve --release mobilenet_v2`: the same handle beside the served models.
serve_step() {
    local name=$1 scenario=$2 port=$3
    local log=$work/$name.log dir=$work/$name
    "$isolane" serve "$scenario" --http "127.0.0.1:$port" --grpc "127.0.0.1:$((port + 1))" \
        --release "$w" --out "$dir" --no-access-log >"$work/$name.stdout" 2>"$log" &
    local pid=$! waited=0
    until grep -q "ready" "$work/$name.stdout" 2>/dev/null; do
        sleep 1
        waited=$((waited + 1))
        if ! kill -0 "$pid" 2>/dev/null || [ "$waited" -ge 150 ]; then
            kill -TERM "$pid" 2>/dev/null
            wait "$pid"
            echo "| $name | not ready (exit $?) | $(tail -1 "$log") | - | - |" >>"$summary"
            return
        fi
    done
    # 10 s of schedule from t0 (taken at the ready line), and a little more.
    sleep 12
    local scraped
    scraped=$(python3 - "$port" "$w" <<'EOF' 2>&1
import sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read().decode()
want = 'isolane_serve_released_jobs_total{workload="%s"}' % sys.argv[2]
line = [l for l in text.splitlines() if l.startswith(want)]
print(line[0].split()[-1] if line else "absent")
EOF
)
    kill -TERM "$pid"
    wait "$pid"
    local rc=$?
    local line
    line=$(grep -o "released \`$w\`: .*" "$log" | head -1)
    local rows=$(($(wc -l <"$dir/jobs/$w.csv" 2>/dev/null || echo 1) - 1))
    echo "| $name | $rc | ${line:-no released line} | $rows | $scraped |" >>"$summary"
}
serve_step green "$green" 18100
serve_step mps "$mps" 18200

{
    echo
    echo "Expected: every exit 0, and the same job count in every cell of every row:"
    echo "\`$w\`'s rate_hz x duration_s (2000 for mobilenet_v2), the released lines ending"
    echo "\"(completed)\" (its schedule ended before the stop)."
} >>"$summary"
tar czf "$out/logs.tgz" -C "$work" --exclude isolane . 2>/dev/null
cat "$summary"
