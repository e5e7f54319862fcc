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
# plans (profiles first: 1–2 min a scenario, then 2 verifications of VERIFY_S; run it in a
#   call of its own, or a few scenarios a call with SCENARIOS="scenarios/planner/a.toml ..."):
#   the first plan's hit rate: each one-GPU green scenario of scenarios/planner/ planned from
#   profiles alone (one cache, RESULTS/profiles, kept between calls; learned stretches removed
#   before each plan) and verified once (`--rounds 1`), with the predicted stretch and again
#   with `--no-predict`; round 1's verdict is the first plan's (hits.txt: one line per
#   scenario and way; each verification's table has predicted against measured p99; OUT/hits.md:
#   the same as a table with each way's hit rate). A call stops starting scenarios once
#   TIME_BUDGET_S (default 400) seconds have passed, and says which it left for the next call,
#   so that a call under the device's 10-minute limit always brings its results back.
#
# ISOLANE_BIN (default stage/isolane), RESULTS (default results/h200-predict), DURATION_S,
# VERIFY_S (default 10: each verification's duration) and OUT (the tarball's folder, default
# /tmp/isolane-predict) override the defaults. DRY_RUN=1 prints the commands.
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
    [ -z "${DRY_RUN:-}" ] && : >"$results/hits.txt"
    left=()
    for sc in ${SCENARIOS:-scenarios/planner/*.toml}; do
        grep -q '^mechanism = "green"' "$sc" || continue
        grep -q '^gpus' "$sc" && continue
        name=$(basename "$sc" .toml)
        if [ -z "${DRY_RUN:-}" ] && [ "$SECONDS" -ge "$budget" ]; then
            left+=("$sc")
            continue
        fi
        for way in predict nopredict; do
            flag=()
            [ "$way" = nopredict ] && flag=(--no-predict)
            # No learned stretch: both ways plan their first plan from profiles alone.
            dir=$results/plans/$way/$name
            so=/dev/stdout se=/dev/stderr
            if [ -z "${DRY_RUN:-}" ]; then
                rm -rf "$cache"/*/*/stretch
                # A folder of an earlier call on this machine: --verify-out wants it empty.
                rm -rf "$dir"
                mkdir -p "$dir"
                so=$dir/stdout.txt se=$dir/stderr.txt
            fi
            run "$bin" plan --auto "$sc" "${flag[@]}" --profile-cache "$cache" \
                -o "$dir/planned.toml" --verify --rounds 1 --verify-duration "$verify_s" \
                --verify-out "$dir/verify" >"$so" 2>"$se"
            code=$?
            [ -n "${DRY_RUN:-}" ] && continue
            verdict=$([ $code = 0 ] && echo holds || { [ $code = 1 ] && echo misses || echo "no plan (exit $code)"; })
            echo "$name $way: $verdict" | tee -a "$results/hits.txt"
        done
    done
    if [ -z "${DRY_RUN:-}" ]; then
        {
            echo "# First plan's hit rate (plan --auto --verify --rounds 1, VERIFY_S=$verify_s s)"
            echo
            echo "| scenario | predicted stretch | --no-predict |"
            echo "| --- | --- | --- |"
            awk '{w = $2; sub(":", "", w); v = $3; for (i = 4; i <= NF; i++) v = v " " $i;
                  r[$1 "/" w] = v; if (!($1 in seen)) { seen[$1] = 1; order[++n] = $1 } }
                END { for (i = 1; i <= n; i++) { s = order[i];
                      printf "| %s | %s | %s |\n", s, r[s "/predict"], r[s "/nopredict"] } }' \
                "$results/hits.txt"
            echo
            for way in predict nopredict; do
                awk -v w="$way" '$2 == w ":" { n++; if ($3 == "holds") h++ }
                    END { printf "%s: %d of %d first plans hold\n", w, h, n }' "$results/hits.txt"
            done
            [ ${#left[@]} -gt 0 ] && echo && echo "Not started (time budget): ${left[*]}"
        } | tee "$out/hits.md"
    fi
fi

[ -z "${DRY_RUN:-}" ] && tar -czf "$out/predict.tar.gz" "$results" && echo "wrote $out/predict.tar.gz"
exit $rc
