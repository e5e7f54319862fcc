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
#
# `settle` (issue 34's one-call measurement, session 25): trios a, b and c, green and MPS each
# calibrated on its own mechanism, the default guard (`both`) only: each trio's alone runs,
# then the victims-only baseline REPEATS (3) times (at the alone deadline, so admission's
# prediction is in each; scored again at the together deadline), then `both` REPEATS times at
# the together deadline (1.3 x the victims-only median p99) and once at the alone deadline
# (ALONE_REPEATS, 1). No only-X rows. 10 runs a trio and mechanism, 60 in all: about 5-6 s a
# green run and 7-8 s an MPS one with their builds, so about 400 s; BUDGET_S (480) is shared
# out as it goes (each study gets what is left over the studies left; a study with under
# MIN_STUDY_S (40) left is not started, and says so), studies in the order a, b, c green, then
# a, b, c MPS. Writes $OUT/settle.md: one table of every trio and mechanism (medians and
# min-max spreads, whether each row meets critical <= 0.1 % and best effort >= 30 %), then each
# study's protection.md, and a table of where best effort's time went (the guard's account of
# its holds in each run's log: running pieces, or held and why). SETTLE_MECHANISMS ("green
# mps") and SETTLE_VARIANTS (both; e.g. both,both@50 to try pieces of 50 µs beside it) change
# what it runs; ALONE_REPEATS=0 leaves the alone deadline's variant rows out; SETTLE_TRIOS
# ("a b c") picks the trios.
# FINE_PIECE_US=F (e.g. 25) adds the variant both~F to the green trios: the default guard with
# best effort in runs of fine pieces (`[protection] fine_piece_us = F`, each run at most the
# study's 100 µs piece; docs/criticality.md "Runs of fine pieces"), beside `both` in the same
# call and the same tables (4 more runs a trio, about 25 s each; raise BUDGET_S to match), e.g.
#   FINE_PIECE_US=25 SETTLE_MECHANISMS=green BUDGET_S=480 bash scripts/levers-h200.sh settle
# (VARIANT~F names the same lever in VARIANTS / SETTLE_VARIANTS directly: both,both~25.)
#
# CAPACITY_BASE=together loads each critical model at LOAD of its capacity beside the other
# (both flat out together, no best effort) instead of alone: session 29 found trio c's light CNN
# ~95 % busy beside its neighbour at 75 % of its alone capacity, which leaves best effort almost
# nothing (docs/criticality.md); this shows what best effort gets where the critical pair has
# headroom.
# BACKEND=cpu runs the same steps with spin stand-ins (a check of the script, not a measurement).
# MECHANISMS (default green; green,mps adds MPS, each calibrated on its own), ISOLANE_BIN
# (stage/isolane), RESULTS (results/h200-levers), OUT (the summary's folder, /tmp/levers).
# Writes $OUT/levers.md (each trio's protection.md), $OUT/<trio>-protection.csv,
# <trio>-misses.csv, <trio>-study.log and <trio>-pieces.txt (the piece lengths share chose).
set -u
cd "$(dirname "$0")/.."

which=${1:-all}
case "$which" in
a | b | c | all | settle) ;;
*)
    echo "usage: levers-h200.sh [a|b|c|all|settle] (got \`$which\`)" >&2
    exit 2
    ;;
esac
fine=${FINE_PIECE_US:-}
case $fine in
'') ;;
*[!0-9]* | 0* | ? | 1?)
    echo "FINE_PIECE_US: expected an integer from 20 to 100 (the study's piece_us), got \`$fine\`" >&2
    exit 2
    ;;
*)
    [ "$fine" -le 100 ] || {
        echo "FINE_PIECE_US: expected an integer from 20 to 100 (the study's piece_us), got \`$fine\`" >&2
        exit 2
    }
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
case $results in /*) export XDG_CACHE_HOME=$results/cache ;; *) export XDG_CACHE_HOME=$PWD/$results/cache ;; esac
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

study() { # name victims best-effort variants [mechanisms budget-s extra-args...]
    local mech=${5:-$mechs} budget=${6:-${BUDGET_S:-240}}
    local extra=("${@:7}")
    # Another mechanism's study of the same trio keeps its own folder (trio a on green and
    # under MPS in one session).
    local name=$1 dir=$results/$1
    [ "$mech" = green ] || { name=$1-${mech//,/-} && dir=$results/$name; }
    local began=$SECONDS
    local common=(--out "$dir" --victims "$2" --best-effort "$3" --mechanisms "$mech"
        --load "${LOAD:-0.75}" --capacity-base "${CAPACITY_BASE:-alone}"
        --deadline-base "${DEADLINE_BASE:-both}"
        --duration "${DURATION_S:-2}" --repeats "${REPEATS:-3}" --l2-mib "${L2_MIB:-24}"
        --isolane "$bin" --backend "${BACKEND:-cuda}")
    echo "=== trio $name: $2 beside $3 ($4)"
    # The alone runs first (no variants), into the cache, then the comparison reusing them.
    python3 scripts/protection_study.py "${common[@]}" --alone-only \
        >"$dir.alone.log" 2>&1 || { tail -n 20 "$dir.alone.log"; return 1; }
    cache_profiles "$dir" | tee -a "$dir.alone.log"
    local left=$((budget - (SECONDS - began)))
    python3 scripts/protection_study.py "${common[@]}" --variants "$4" --skip-alone \
        --budget-s "$((left > 1 ? left : 1))" "${extra[@]}" >"$dir.log" 2>&1 ||
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

# One table of every study of `settle`, from their protection.csv: per trio, mechanism, deadline
# base and variant, the medians and min-max spreads over the repeats, and the issue's targets.
settle_summary() { # studies (name:mechanism ...)
    python3 - "$out" "$results" "$@" <<'PY'
import csv, os, statistics, sys
out, results, studies = sys.argv[1], sys.argv[2], sys.argv[3:]
def cell(v, fmt):
    if not v:
        return "—"
    return f"{fmt(statistics.median(v))} [{fmt(min(v))}–{fmt(max(v))}]"
pc = lambda x: f"{x:.2f}"
share = lambda x: f"{100 * x:.1f} %"
lines = ["| trio | mechanism | deadline base | variant | runs | light CNN late % | heavy CNN late % "
         "| best effort, of alone | admission predicted a miss of | critical ≤ 0.1 % / best effort ≥ 30 % |",
         "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- | --- |"]
missing = []
for st in studies:
    name, mech = st.split(":")
    path = os.path.join(results, name, "protection.csv")
    if not os.path.exists(path):
        missing.append(f"{name} ({mech})")
        continue
    rows = [r for r in csv.DictReader(open(path)) if r["study"] == "compare"]
    keys = []
    for r in rows:
        k = (r["base"], r["variant"])
        if k not in keys and not k[1].startswith("only-"):
            keys.append(k)
    victims = sorted({r["workload"] for r in rows if r["criticality"] == "critical"})
    for base, variant in keys:
        rs = [r for r in rows if (r["base"], r["variant"]) == (base, variant)]
        late = [[float(r["timeout_pct"]) for r in rs if r["workload"] == v] for v in victims]
        be = [float(r["of_alone"]) for r in rs if r["criticality"] == "best_effort"
              and r["of_alone"] != ""]
        warned = sorted({r["workload"] for r in rs if r["predicted_miss"] == "1"})
        asked = any(r["predicted_miss"] != "" for r in rs)
        crit_ok = all(l and statistics.median(l) <= 0.1 for l in late)
        verdict = ("yes" if crit_ok else "no") + " / " + (
            "—" if not be else "yes" if statistics.median(be) >= 0.30 else "no")
        runs = len({r["repeat"] for r in rs})
        lines.append(f"| {name[0]} | {mech} | {base} | {variant} | {runs} | "
                     + " | ".join(cell(l, pc) for l in late)
                     + f" | {cell(be, share)} | "
                     + ((", ".join(warned) or "none") if asked else "not asked") + f" | {verdict} |")
# Where best effort's time went (the guard's account in each run's log), for the rows with
# best effort: the medians over the repeats, as % of its time.
parts = ["ran", "too_long", "running", "next", "between", "budget", "backlog", "overrun"]
heads = ["ran pieces", "held: too long for the slack", "held: no slack in a running critical job",
         "held: no slack before the next critical job", "held: between critical jobs",
         "held: loop budget", "held: backlog", "held: past estimate"]
time_lines = ["| trio | mechanism | deadline base | variant | µs a piece (a run for ~F) | "
              + " | ".join(heads) + " |", "| --- | --- | --- | --- |" + " ---: |" * (len(parts) + 1)]
for st in studies:
    name, mech = st.split(":")
    path = os.path.join(results, name, "protection.csv")
    if not os.path.exists(path):
        continue
    rows = [r for r in csv.DictReader(open(path)) if r["study"] == "compare"
            and r["criticality"] == "best_effort" and r.get("be_ran", "") != ""]
    keys = []
    for r in rows:
        if (r["base"], r["variant"]) not in keys:
            keys.append((r["base"], r["variant"]))
    for base, variant in keys:
        rs = [r for r in rows if (r["base"], r["variant"]) == (base, variant)]
        med = lambda k: statistics.median(float(r["be_" + k] or 0) for r in rs)
        time_lines.append(f"| {name[0]} | {mech} | {base} | {variant} | {med('piece_us'):.0f} | "
                          + " | ".join(f"{med(k):.1f} %" for k in parts) + " |")
text = ["# Issue 34 in one call: trios a, b, c under the default guard (`both`)", "",
        "Medians over the repeats, [min–max] spread. Deadline base `alone`: 1.3 × each critical "
        "model's p99 alone in its partition; `together`: 1.3 × its median p99 in the "
        "victims-only runs (the same trio, no best effort). `victims-only`: both critical "
        "models at 75 %, no best effort (at the alone base admission was asked: its "
        "prediction is in its log). `both`: the default guard (guard + priorities); "
        "`share`: + `[protection] share`; `VARIANT@N`: with best-effort pieces of N µs "
        "instead of 100; `VARIANT~F`: with best effort in runs of fine pieces of F µs "
        "(`[protection] fine_piece_us`), each run at most the piece length. Every guarded row runs `piece_us = 100` and `margin_us = 20` "
        "(protection_study.py's, not `[protection]`'s defaults of 250 and 100). The verdict "
        "compares the medians with the targets.", ""] + lines
if len(time_lines) > 2:
    text += ["", "## Where best effort's time went", "",
             "The guard's own account (its line in each run's log): the share of best effort's "
             "time (from its first ask to its last piece's end) spent running pieces (each a "
             "launch and a wait; with fine pieces, runs of them launched back to back and "
             "waited for once) and held, by why: a shorter piece (20 µs) would have been "
             "admitted; a running critical job had no slack left; the next critical job (not "
             "begun) had none; a critical workload was between jobs; and under `share`, the "
             "closed loop's budget, a critical backlog, or a critical job past its estimate. "
             "Medians over the repeats.", ""] + time_lines
if missing:
    text += ["", "Not run (budget or failure): " + ", ".join(missing) + "."]
open(os.path.join(out, "settle.md"), "w").write("\n".join(text) + "\n")
print("\n".join(text))
PY
}

mkdir -p "$results"
: >"$out/levers.md"
rc=0
if [ "$which" = settle ]; then
    budget=${BUDGET_S:-480} began=$SECONDS
    plan=()
    for m in ${SETTLE_MECHANISMS:-green mps}; do
        [ "${BACKEND:-cuda}" = cpu ] && [ "$m" != green ] && continue
        for t in ${SETTLE_TRIOS:-a b c}; do
            case $t in
            a | b | c) plan+=("$t:$m") ;;
            *) echo "SETTLE_TRIOS: a, b or c (got \`$t\`)" >&2 && exit 2 ;;
            esac
        done
    done
    ran=()
    for i in "${!plan[@]}"; do
        t=${plan[$i]%%:*} m=${plan[$i]#*:}
        name=$t
        [ "$m" = green ] || name=$t-$m
        ran+=("$name:$m")
        left=$((budget - (SECONDS - began)))
        each=$((left / (${#plan[@]} - i)))
        if [ "$each" -lt "${MIN_STUDY_S:-40}" ]; then
            echo "=== trio $t ($m): not started, ${left} s of BUDGET_S left"
            continue
        fi
        case $t in
        a) v=resnet18:24,resnet50:48 be=vit_l_32:48 ;;
        b) v=mobilenet_v2:24,convnext_base:48 be=vit_b_16:48 ;;
        c) v=mobilenet_v2:24,resnet50:48 be=vit_l_32:48 ;;
        esac
        variants=${SETTLE_VARIANTS:-both}
        [ -n "$fine" ] && [ "$m" = green ] && variants+=",both~$fine"
        DEADLINE_BASE=both study "$t" "$v" "$be" "$variants" "$m" "$each" \
            --no-single-baselines --alone-base-repeats "${ALONE_REPEATS:-1}" || rc=1
    done
    settle_summary "${ran[@]}" >/dev/null
    cat "$out/settle.md"
    echo "settle: $((SECONDS - began)) s"
    exit $rc
fi
variants=${VARIANTS:-both,share}
[ "$which" = a ] || [ "$which" = all ] &&
    { study a resnet18:24,resnet50:48 vit_l_32:48 "${VARIANTS_A:-$variants}" || rc=1; }
[ "$which" = b ] || [ "$which" = all ] &&
    { study b mobilenet_v2:24,convnext_base:48 vit_b_16:48 "$variants" || rc=1; }
[ "$which" = c ] || [ "$which" = all ] &&
    { study c mobilenet_v2:24,resnet50:48 vit_l_32:48 "$variants" || rc=1; }
exit $rc
