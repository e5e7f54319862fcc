#!/usr/bin/env bash
# Issue 35's measurement on the H200: three models served as MPS clients
# (scenarios/serve/h200-replan.toml) while resnet50's request rate triples for 20 s and falls,
# served three ways by scripts/replan_h200.py: fixed shares, `isolane ctl resize` at the load
# changes (then `ctl load resnet50`: a rebuilt model's pause), and `serve --autoplan`, which
# grows resnet50 to what the critical model leaves (best_effort_capped) and shrinks it back
# when the rate falls. Per mode and model: sent, answered, late, refused, failed (none may be:
# a lost request would be one), p50/p99/max client latency; whether the critical model kept
# <= 0.1 % late; each resize's and the reload's time to the new client serving and its pause;
# autoplan's decisions. About 4.5 minutes in all (80 s of profiles, then 3 × about 55 s).
#
#   scripts/replan-h200.sh stage    # here: scripts/serve-bench.sh stage (release isolane and
#                                   # the HTTP client's wheels for the GPU machine, stage-serve/)
#   (device run, carry ["stage-serve"], timeout_s 600)  bash scripts/replan-h200.sh run
#                                   # there: $OUT gets summary.md, summary.json, gpu.txt and
#                                   # replan.tgz (the servers' logs, autoplan.csv, each request)
#
# `run` first has `isolane plan --auto --mechanism mps` measure the profiles --autoplan plans
# from (each model alone at the thread shares its search visits, 100 jobs each, at most
# PROFILE_BUDGET s, default 80) into a fresh cache, seeded from PROFILES (default
# results/h200-control/profiles, when there: profiles of the same GPU and driver are not
# measured again); what it plans is not used. $OUT/profiles.tgz has the cache, to commit as
# PROFILES. Environment: ISOLANE (a binary instead of the staged one), PYTHON, SCENARIO, MODES
# (default fixed,manual,autoplan), REPLAN_TIMEOUT (default 240 s).
#
# SCENARIO=scenarios/serve/h200-replan-green.toml runs the same three ways in green contexts
# (SMs of each model's own instead of MPS thread shares, which are caps on shared SMs): the
# profiles are measured with --mechanism green, the manual resizes are `sms=`, and a second
# OUT folder keeps the two runs apart. One scenario a call (each about 4.5 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."

run() {
    local out=${OUT:-/tmp/isolane-replan} work=/tmp/replan status=0
    local python=${PYTHON:-python3} isolane=${ISOLANE:-}
    local scenario=${SCENARIO:-scenarios/serve/h200-replan.toml}
    local mechanism
    mechanism=$(sed -n 's/^mechanism *= *"\([a-z_]*\)".*/\1/p' "$scenario" | head -n 1)
    mechanism=${mechanism:-mps}
    mkdir -p "$out"
    rm -rf "$work" && mkdir -p "$work/results"
    if [ -z "$isolane" ]; then
        if [ ! -f stage-serve/isolane.xz ]; then
            echo "run: no stage-serve/isolane.xz (scripts/replan-h200.sh stage, carry stage-serve)" >&2
            return 2
        fi
        xz -dc stage-serve/isolane.xz >"$work/isolane" && chmod +x "$work/isolane"
        isolane=$work/isolane
    fi
    if [ "${STAGED_CLIENTS:-1}" != 0 ]; then
        if [ ! -f stage-serve/site.tar.xz ]; then
            echo "run: no stage-serve/site.tar.xz (scripts/replan-h200.sh stage)" >&2
            return 2
        fi
        mkdir -p "$work/site" && tar xJf stage-serve/site.tar.xz -C "$work/site"
        export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"
    fi
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,mig.mode.current --format=csv \
        >"$out/gpu.txt" 2>&1 || echo "no nvidia-smi" >"$out/gpu.txt"
    cat "$out/gpu.txt"
    local cache=$work/profiles budget=${PROFILE_BUDGET:-80}
    local seed=${PROFILES:-results/h200-control/profiles}
    mkdir -p "$cache"
    if [ -d "$seed" ]; then
        cp -r "$seed/." "$cache/"
        echo "replan: profile cache seeded from $seed"
    fi
    echo "replan: $scenario ($mechanism): profiling for --autoplan (at most $budget s)"
    # Its exit code is the plan's (2 where the scenario's shares cannot be planned); the
    # profiles it measured are in the cache either way.
    timeout -k 10 "$((budget + 60))" "$isolane" plan --auto "$scenario" --mechanism "$mechanism" \
        --profile-jobs 100 --profile-budget "$budget" --profile-cache "$cache" \
        -o "$work/results/planned.toml" >"$work/results/plan.log" 2>&1 || true
    tail -n 30 "$work/results/plan.log"
    find "$cache" -name '*.json' | sort | sed "s|$cache/||" | tee "$work/results/profiles.txt"
    tar czf "$out/profiles.tgz" -C "$cache" .
    PYTHONUNBUFFERED=1 timeout -k 30 "${REPLAN_TIMEOUT:-240}" "$python" scripts/replan_h200.py \
        --isolane "$isolane" --scenario "$scenario" --out "$work/results" \
        --profile-cache "$cache" --modes "${MODES:-fixed,manual,autoplan}" "$@" \
        2>&1 | tee "$work/results/driver.log" || status=$?
    cp "$work/results/summary.md" "$work/results/summary.json" "$out/" 2>/dev/null || status=1
    tar czf "$out/replan.tgz" -C "$work" results
    return "$status"
}

case "${1:-}" in
    stage) bash scripts/serve-bench.sh stage ;;
    run) shift; run "$@" ;;
    *) echo "usage: $0 stage | run [DRIVER ARGS...]" >&2; exit 2 ;;
esac
