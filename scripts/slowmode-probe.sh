#!/usr/bin/env bash
# Where does a short-kernel model's per-run "slow mode" come from (docs/interference.md)?
# resnet18 fp16 alone in its partition at a fixed rate, run after run, varying one thing at a
# time: CPU core of the release thread, rate, mechanism/host. Prints exec p50 per run.
#   device: (carry ["stage"])  bash scripts/slowmode-probe.sh
set -u
cd "$(dirname "$0")/.."
bin=${ISOLANE_BIN:-stage/isolane}
dir=${OUT_DIR:-/tmp/slowmode}
mkdir -p "$dir"
one() { # name mechanism host partition rate cpu
    local f="$dir/$1.toml"
    {
        printf '[device]\nbackend = "cuda"\nmechanism = "%s"\nhost = "%s"\n\n' "$2" "$3"
        printf '[[workload]]\nname = "r18"\nmodel = "resnet18"\nprecision = "fp16"\n'
        printf 'rate_hz = %s\nduration_s = 2\nwarmup_jobs = 50\n' "$5"
        [ -n "$4" ] && printf 'partition = %s\n' "$4"
        [ -n "$6" ] && printf 'cpu = [%s]\n' "$6"
    } >"$f"
    "$bin" run -q --force --out "$dir/$1" "$f" >"$dir/$1.log" 2>&1 || { echo "$1: failed"; tail -3 "$dir/$1.log"; return; }
    python3 - "$dir/$1" "$1" <<'PY'
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1] + "/jobs/r18.csv")) if r["end_ms"]]
ex = sorted(float(r["end_ms"]) - float(r["start_ms"]) for r in rows)
lag = sorted(float(r["start_ms"]) - float(r["release_ms"]) for r in rows)
n = len(ex)
print(f"{sys.argv[2]:28s} jobs {n:5d} exec p50 {ex[n//2]:.3f} p99 {ex[int(n*.99)]:.3f} start lag p50 {lag[n//2]:.3f}")
PY
}
nvidia-smi topo -m 2>&1 | head -5
lscpu | grep -E "^(CPU\(s\)|Thread|Core|Socket|NUMA)" 
case "${1:-all}" in
paths)
    # Is it the build's timed choices? The timed choice (both paths), then each path forced.
    for i in 1 2 3 4; do one "mps-max-both-$i" mps process "{ thread_pct = 24 }" '"max"' ""; done
    for i in 1 2 3; do one "green-max-both-$i" green thread "{ sms = 32 }" '"max"' ""; done
    for conv in gemm cudnn; do
        for i in 1 2; do
            ISOLANE_CUDA_CONV=$conv one "mps-max-$conv-$i" mps process "{ thread_pct = 24 }" '"max"' ""
        done
    done
    ;;
*)
for i in 1 2 3; do one "mps-max-$i" mps process "{ thread_pct = 24 }" '"max"' ""; done
for i in 1 2 3; do one "mps-1750-$i" mps process "{ thread_pct = 24 }" 1750 ""; done
for c in 0 3 8 12; do one "mps-1750-cpu$c" mps process "{ thread_pct = 24 }" 1750 "$c"; done
for r in 500 1000 1500; do one "mps-$r" mps process "{ thread_pct = 24 }" $r ""; done
for i in 1 2; do one "mps100-1750-$i" mps process "{ thread_pct = 100 }" 1750 ""; done
for i in 1 2 3; do one "green-1750-$i" green thread "{ sms = 32 }" 1750 ""; done
for i in 1 2; do one "ts-proc-1750-$i" timeslice process "" 1750 ""; done
;;
esac
