#!/usr/bin/env bash
# Issue 34's isolation levers measured on the H200 (docs/criticality.md "Levers"), with a
# staged build:
#
#   here:   bash scripts/gpu-test.sh stage
#   device: (carry ["stage"])  bash scripts/levers-h200.sh [a|b|c|all]
#
# Three trios, each two critical CNNs (a light one in 24 SMs, a heavier one in 48) at LOAD
# (0.75) of their capacity alone in their partition, beside a transformer flat out as best
# effort in 48 SMs (scripts/protection_study.py; fp16, green contexts, thread host), under both
# of the issue's deadlines (DEADLINE_BASE=both, the default: 1.3 x each p99 alone in its
# partition, then 1.3 x its p99 in the victims-only run, the median of its repeats; alone or
# together for one):
#   a  resnet18:24 + resnet50:48, best effort vit_l_32:48   (the issue's light/heavy CNN case)
#   b  mobilenet_v2:24 + convnext_base:48, best effort vit_b_16:48
#   c  mobilenet_v2:24 + resnet50:48, best effort vit_l_32:48
# Variants (VARIANTS, default both,share; VARIANTS_A for trio a alone; VARIANT@N: with
# best-effort pieces of N µs instead of 100, e.g. share@25). Since session 22 `share` sizes
# best effort's pieces to the critical workloads' gaps between jobs itself (half the narrowest
# median gap, never longer than piece_us, only where that is at least 20 µs: on the H200 at
# 75 % the gaps were 2-30 µs, so these trios keep 100 µs pieces; docs/criticality.md
# "Gap-sized pieces"); each run's log says the length it chose, collected in
# $OUT/<trio>-pieces.txt. both (guard +
# priorities: the default protection), share (+ share: the sharing guard, session 21: each
# best-effort piece charged the delay the fitted model predicts for what is left of each critical
# job it overlaps, times the gain that job's workload measures on its own jobs (overlapped vs
# clean), against that job's slack and within that workload's budget of overlapped jobs, which
# halves at once on a job near its deadline; held only until what is left fits), slack (+ slack_order: a critical job with slack delays its
# start, whole, while one without runs), and on request none (unprotected), l2
# (+ l2_persist_mib = L2_MIB), levers (all three). protection_study.py runs the baselines first
# in the same call: each victim alone at its rate, and victims-only (both, no best effort).
# Each row REPEATS times (3; the victims-only baseline too: on the H200 it moved from 2.44 to
# 0.02 % between two calls), the median and the spread (min-max) reported; repeat by repeat,
# so that BUDGET_S (240 s for a trio, its alone runs included: no run starts after it) cuts
# repeats, never whole rows; the rows not run are listed. DURATION_S (2) s a run, up to about
# 15 s a run with its builds: 20 runs a trio with the defaults (3 alone, 2 each-victim-alone,
# 3 victims-only, 2 variants x 2 deadlines x 3). One trio a step of scripts/session-gpu.sh
# (levers-a, levers-b, levers-c; levers-mps: trio a under MPS, MECHANISMS=mps), each under
# 5 minutes.
# Before the comparisons, each workload's alone run is written into the profile cache (as
# `plan --auto` would measure it), so that admission's prediction (`[protection] admission`,
# on by default) has each p99 alone: the victims-only and trio runs then say, in their logs,
# which critical workload is predicted to miss beside its neighbours; protection.md's last
# column names them.
#
# BACKEND=cpu runs the same steps with spin stand-ins (a check of the script, not a measurement).
# MECHANISMS (default green; green,mps adds MPS, each calibrated on its own), ISOLANE_BIN
# (stage/isolane), RESULTS (results/h200-levers), OUT (the summary's folder, /tmp/levers).
# Writes $OUT/levers.md (each trio's protection.md), $OUT/<trio>-protection.csv,
# <trio>-misses.csv, <trio>-study.log and <trio>-pieces.txt (the piece lengths share chose).
set -u
cd "$(dirname "$0")/.."

which=${1:-all}
case "$which" in
a | b | c | all) ;;
*)
    echo "usage: levers-h200.sh [a|b|c|all] (got \`$which\`)" >&2
    exit 2
    ;;
esac
for f in stage/*.xz; do
    [ -f "$f" ] && xz -d -f "$f" && chmod +x "${f%.xz}"
done
bin=${ISOLANE_BIN:-$PWD/stage/isolane}
results=${RESULTS:-results/h200-levers}
out=${OUT:-/tmp/levers}
mechs=${MECHANISMS:-green}
mkdir -p "$results" "$out"
# The profile cache admission reads: a folder of this run's own (nothing older is trusted).
export XDG_CACHE_HOME=$PWD/$results/cache
rev=$(sed -n 's/^pub const ENGINE_REVISION: u32 = \([0-9]*\);/\1/p' crates/isolane-cuda/src/lib.rs)

if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,temperature.gpu \
        --format=csv,noheader | tee "$results/gpu.txt"
fi
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 2>/dev/null)
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader -i 0 2>/dev/null)

# Each alone run of a study into the profile cache, keyed as `plan --auto` keys its profiles.
cache_profiles() {
    python3 - "$1" "$XDG_CACHE_HOME/isolane/profiles" "$gpu" "$driver" "$rev" <<'PY'
import csv, json, os, re, sys
study, cache, gpu, driver, rev = sys.argv[1:]
clean = lambda s: re.sub(r"[^A-Za-z0-9.]", "_", s)
d = os.path.join(cache, clean(gpu), clean(driver))
os.makedirs(d, exist_ok=True)
with open(os.path.join(d, "device.json"), "w") as f:
    json.dump({"gpu": gpu, "driver": driver, "device_model": "h200"}, f)
alone = os.path.join(study, "alone")
for mech in sorted(os.listdir(alone)) if os.path.isdir(alone) else []:
    for w in sorted(os.listdir(os.path.join(alone, mech))):
        folder = os.path.join(alone, mech, w)
        text = open(os.path.join(folder, "scenario-in.toml")).read()
        model = re.search(r'^model = "(.*)"', text, re.M).group(1)
        sms = re.search(r"sms = (\d+)", text)
        pct = re.search(r"thread_pct = (\d+)", text)
        part = sms.group(1) if mech == "green" and sms else pct.group(1) if pct else None
        if part is None:
            continue
        with open(os.path.join(folder, "run", "jobs", w + ".csv")) as f:
            ex = sorted(float(r["end_ms"]) - float(r["start_ms"])
                        for r in csv.DictReader(f) if r["end_ms"])
        if not ex:
            continue
        q = lambda p: ex[min(len(ex) - 1, int(len(ex) * p))]
        times = {"exec_p50_ms": q(.5), "exec_p99_ms": q(.99),
                 "exec_mean_ms": sum(ex) / len(ex), "exec_p999_ms": q(.999),
                 "engine_revision": int(rev)}
        with open(os.path.join(d, f"{model}-b1-fp16-{mech}-{part}.json"), "w") as f:
            json.dump(times, f)
        print(f"profile: {model} {mech} {part}: exec p99 {times['exec_p99_ms']:.3f} ms")
PY
}

study() { # name victims best-effort variants
    # Another mechanism's study of the same trio keeps its own folder (trio a on green and
    # under MPS in one session).
    local name=$1 dir=$results/$1
    [ "$mechs" = green ] || { name=$1-${mechs//,/-} && dir=$results/$name; }
    local began=$SECONDS
    local common=(--out "$dir" --victims "$2" --best-effort "$3" --mechanisms "$mechs"
        --load "${LOAD:-0.75}" --deadline-base "${DEADLINE_BASE:-both}"
        --duration "${DURATION_S:-2}" --repeats "${REPEATS:-3}" --l2-mib "${L2_MIB:-24}"
        --isolane "$bin" --backend "${BACKEND:-cuda}")
    echo "=== trio $name: $2 beside $3 ($4)"
    # The alone runs first (no variants), into the cache, then the comparison reusing them.
    python3 scripts/protection_study.py "${common[@]}" --alone-only \
        >"$dir.alone.log" 2>&1 || { tail -n 20 "$dir.alone.log"; return 1; }
    cache_profiles "$dir" | tee -a "$dir.alone.log"
    local left=$((${BUDGET_S:-240} - (SECONDS - began)))
    python3 scripts/protection_study.py "${common[@]}" --variants "$4" --skip-alone \
        --budget-s "$((left > 1 ? left : 1))" >"$dir.log" 2>&1 ||
        { tail -n 20 "$dir.log"; return 1; }
    { echo "## Trio $name: $2, best effort $3"; echo; sed 1d "$dir/protection.md"; echo; } \
        >>"$out/levers.md"
    cp "$dir/protection.csv" "$out/$name-protection.csv"
    # The misses' attribution and the study's log (each run's command, in order: its timing).
    cp "$dir/misses.csv" "$out/$name-misses.csv" 2>/dev/null
    cp "$dir.log" "$out/$name-study.log"
    grep -h "best effort: pieces of" "$dir"/compare/*/r*/log.txt 2>/dev/null | sort | uniq -c \
        >"$out/$name-pieces.txt"
    tail -n 12 "$dir/protection.md"
}

mkdir -p "$results"
: >"$out/levers.md"
rc=0
variants=${VARIANTS:-both,share}
[ "$which" = a ] || [ "$which" = all ] &&
    { study a resnet18:24,resnet50:48 vit_l_32:48 "${VARIANTS_A:-$variants}" || rc=1; }
[ "$which" = b ] || [ "$which" = all ] &&
    { study b mobilenet_v2:24,convnext_base:48 vit_b_16:48 "$variants" || rc=1; }
[ "$which" = c ] || [ "$which" = all ] &&
    { study c mobilenet_v2:24,resnet50:48 vit_l_32:48 "$variants" || rc=1; }
exit $rc
