#!/usr/bin/env bash
# Issue 34's prediction measured on the H200 (docs/interference.md "Predicting the stretch",
# docs/planner.md "Predicted stretch"), with a staged binary:
#
#   here:   bash scripts/gpu-test.sh stage
#   device: (carry ["stage"])  bash scripts/predict-h200.sh [matrix|plans|all]
#   here:   tar -xzf /path/to/predict.tar.gz   (puts results/h200-predict back)
#
# matrix (~4 min of GPU time): an interference matrix in green contexts, fp16, victims
#   resnet18, resnet50, mobilenet_v2 and vit_b_16 at 75 % of their capacity alone in 32 SMs,
#   neighbours resnet18, resnet50, vit_b_16, vit_l_32 and convnext_base flat out in 48 SMs (each
#   also alone), DURATION_S (default 3) s a cell; then scripts/interference_predict.py's error
#   per pair of the H200 model against it (prediction.md), 18 of 20 pairs new to its fit.
# plans: the first plan's hit rate (issue 34, "Measure"): each one-GPU green scenario of
#   scenarios/planner/ (SCENARIOS="scenarios/planner/a.toml ..." picks some) planned from
#   profiles alone, with the predicted stretch and again with `--no-predict`, its first plan
#   verified once (`--rounds 1`, VERIFY_S s). One profile cache, RESULTS/profiles, serves every
#   scenario and call (carry it: extract the tarball here before the next call); learned
#   stretches are removed before each plan. `--no-predict` is planned first without a run: where
#   its partitions are the prediction's, the prediction's verdict is its own (VERIFY_BOTH=1 runs
#   it anyway). Each way's folder RESULTS/plans/WAY/SCENARIO has verdict.txt, planned.toml, the
#   output and verify/; hits.txt a line per verdict; OUT/hits.md the table of every verdict
#   under RESULTS/plans (earlier calls' too) by scripts/predict_hits.py: each first plan's
#   partitions, the planner's verdict, how many critical workloads held, who was late, the
#   predicted p99 furthest from the measured, and each way's hit rate. A call starts no scenario
#   after TIME_BUDGET_S (default 400) s and names those it left; no command runs past
#   CALL_LIMIT_S (default 540) s, so that the results always come back. scripts/session-gpu.sh
#   plans-1 and plans-2 split the eight scenarios into two calls of under 5 minutes.
#   The CPU check of every path (BACKEND=cpu: each scenario's twin on the CPU, spin models,
#   deadlines SLOW times longer, the first CPU_KEEP workloads; ISOLANE_BIN=target/debug/isolane
#   PROFILE_JOBS=50 VERIFY_S=1 RESULTS=/tmp/r OUT=/tmp/o): CPU_KEEP=2 gives plans that hold
#   (VERIFY_BOTH=1: both ways run), all three workloads on two cores no plan, TIME_BUDGET_S=0
#   scenarios not started, CALL_LIMIT_S=1 VERIFY_S=40 runs cut short, and SLOW=5 CPU_KEEP=2
#   beside a few `yes` processes plans that miss.
#
# ISOLANE_BIN (default stage/isolane), RESULTS (default results/h200-predict), DURATION_S,
# VERIFY_S (default 10: each verification's duration), PROFILE_JOBS (default 1000: jobs of each
# profile run) and OUT (the tarball's folder, default /tmp/isolane-predict) override the
# defaults. DRY_RUN=1 prints the commands.
set -u
cd "$(dirname "$0")/.."

which=${1:-all}
case "$which" in
matrix | plans | all) ;;
*)
    echo "usage: predict-h200.sh [matrix|plans|all] (got \`$which\`)" >&2
    exit 2
    ;;
esac
bin=${ISOLANE_BIN:-stage/isolane}
results=${RESULTS:-results/h200-predict}
duration=${DURATION_S:-3}
verify_s=${VERIFY_S:-10}
budget=${TIME_BUDGET_S:-400}
limit=${CALL_LIMIT_S:-540}
profile_jobs=${PROFILE_JOBS:-1000}
backend=${BACKEND:-cuda}
out=${OUT:-/tmp/isolane-predict}
[ -z "${DRY_RUN:-}" ] && mkdir -p "$results" "$out"

run() {
    echo "+ $*"
    if [ -n "${DRY_RUN:-}" ]; then
        return 0
    fi
    local start=$SECONDS
    "$@"
    local rc=$?
    printf '%s\t%4ds\trc=%d\t%s\n' "$(date -u +%FT%TZ)" $((SECONDS - start)) "$rc" "$*" \
        >>"$results/commands.txt"
    return $rc
}

if [ "$backend" = cpu ] && [ "$which" != plans ]; then
    echo "predict-h200.sh: BACKEND=cpu checks \`plans\` only" >&2
    exit 2
fi
if [ -z "${DRY_RUN:-}" ] && command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,temperature.gpu,mig.mode.current \
        --format=csv,noheader | tee "$results/gpu.txt"
fi

rc=0
if [ "$which" != plans ]; then
    run "$bin" interference --backend cuda --mechanism green \
        --victims resnet18,resnet50,mobilenet_v2,vit_b_16 \
        --neighbours resnet18,resnet50,vit_b_16,vit_l_32,convnext_base \
        --victim-size 32 --neighbour-sizes 48 --precisions fp16 --victim-load 0.75 \
        --neighbour-alone --duration-s "$duration" --force --out "$results/matrix" || rc=$?
    if [ -z "${DRY_RUN:-}" ]; then
        python3 scripts/interference_predict.py "$results/matrix" | tee "$results/prediction.md" ||
            rc=$?
    fi
fi

if [ "$which" != matrix ]; then
    cache=$results/profiles
    left=()
    # The partitions of a planned file (its comments and the resolved seed left out): two ways
    # with the same ones are one plan, verified once.
    partitions() { grep -v -e '^#' -e '^seed' "$1" 2>/dev/null; }
    # plan_one WAY NAME FILE [verify]: the first plan of FILE, the way WAY, in
    # RESULTS/plans/WAY/NAME (verdict.txt, planned.toml, stdout.txt, stderr.txt, verify/).
    plan_one() {
        local way=$1 name=$2 file=$3 verify=${4:-} dir=$results/plans/$1/$2 code
        local flag=() limit_s
        [ "$way" = nopredict ] && flag=(--no-predict)
        [ -n "$verify" ] && flag+=(--verify --rounds 1 --verify-duration "$verify_s"
            --verify-out "$dir/verify")
        # Never past the call's limit, so that the results always come back.
        limit_s=$((limit > SECONDS + 20 ? limit - SECONDS : 20))
        set -- timeout -k 10 "$limit_s" "$bin" plan --auto "$file" "${flag[@]}" \
            --profile-jobs "$profile_jobs" --profile-cache "$cache" -o "$dir/planned.toml"
        if [ -n "${DRY_RUN:-}" ]; then
            run "$@"
            return 0
        fi
        # No learned stretch: both ways plan their first plan from profiles alone.
        rm -rf "$cache"/*/*/stretch
        # A folder of an earlier call on this machine: --verify-out wants it empty.
        rm -rf "$dir"
        mkdir -p "$dir"
        run "$@" >"$dir/stdout.txt" 2>"$dir/stderr.txt"
        code=$?
        local v
        case $code in
        0) v=$([ -n "$verify" ] && echo holds || echo planned) ;;
        1) if [ -e "$dir/verify/summary.json" ]; then v=misses; else
            v="failed (exit 1: $(tail -1 "$dir/stderr.txt"))"; fi ;;
        2) if [ -e "$dir/planned.toml" ]; then v="refused (exit 2: $(tail -1 "$dir/stderr.txt"))"
            else v="no plan"; fi ;;
        124 | 137) v="cut short at the call's limit" ;;
        *) v="failed (exit $code)" ;;
        esac
        echo "$v" >"$dir/verdict.txt"
        [ -n "$verify" ] || [ "$v" != planned ] && echo "$name $way: $v" | tee -a "$results/hits.txt"
    }
    twins=$(mktemp -d)
    for sc in ${SCENARIOS:-scenarios/planner/*.toml}; do
        grep -q '^mechanism = "green"' "$sc" || continue
        grep -q '^gpus' "$sc" && continue
        name=$(basename "$sc" .toml)
        if [ -z "${DRY_RUN:-}" ] && [ "$SECONDS" -ge "$budget" ]; then
            left+=("$sc")
            continue
        fi
        file=$sc
        if [ "$backend" = cpu ]; then
            # The CPU check of this script: the same scenario on the CPU, each model a spin of
            # SPIN, its deadline SLOW (default 50) times longer and its rate as many times
            # lower (no memory-system figures there: both ways plan alike).
            file=$twins/$name.toml
            sed -e 's/^backend = "cuda"/backend = "cpu"/' -e '/^mechanism = /d' -e '/^host = /d' \
                -e '/^batch = /d' -e '/^precision = /d' \
                -e "s/^model = .*/model = \"spin:${SPIN:-0.3ms}\"/" "$sc" |
                awk -v k="${SLOW:-50}" -v keep="${CPU_KEEP:-0}" '
                    /^\[\[workload\]\]/ { n++ } keep > 0 && n > keep { next }
                    /^deadline_ms = / { $3 = $3 * k } /^rate_hz = / { $3 = $3 / k } { print }' >"$file"
        fi
        plan_one predict "$name" "$file" verify
        # --no-predict's plan first: where it is the prediction's, its verdict is the same.
        plan_one nopredict "$name" "$file"
        [ -n "${DRY_RUN:-}" ] && continue
        p=$results/plans/predict/$name n=$results/plans/nopredict/$name
        if [ "${VERIFY_BOTH:-}" != 1 ] && grep -qE '^(holds|misses)$' "$p/verdict.txt" 2>/dev/null &&
            [ -e "$n/planned.toml" ] && [ "$(partitions "$p/planned.toml")" = "$(partitions "$n/planned.toml")" ]; then
            echo "$(cat "$p/verdict.txt") (same plan as predict)" >"$n/verdict.txt"
            echo "$name nopredict: $(cat "$n/verdict.txt")" | tee -a "$results/hits.txt"
        elif [ -e "$n/planned.toml" ]; then
            plan_one nopredict "$name" "$file" verify
        fi
    done
    rm -rf "$twins"
    if [ -z "${DRY_RUN:-}" ]; then
        # Every verdict under RESULTS/plans, this call's and earlier calls' whose results were
        # carried here.
        python3 scripts/predict_hits.py "$results" --left "${left[*]}" --verify-s "$verify_s" |
            tee "$out/hits.md" || rc=$?
    fi
fi

[ -z "${DRY_RUN:-}" ] && tar -czf "$out/predict.tar.gz" "$results" && echo "wrote $out/predict.tar.gz"
exit $rc
