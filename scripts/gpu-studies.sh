#!/usr/bin/env bash
# The papers' studies (issue 6) on the GPU machine, in device calls of at most 10 minutes each.
#
#   here:   bash scripts/gpu-test.sh stage        (or STAGE_PACKAGES="-p isolane-cli" for less)
#   device: (carry ["stage"])  bash scripts/gpu-studies.sh [SCALE] [BUDGET_S]
#   here:   bash scripts/gpu-studies.sh unpack /work/.device/<call>/results.tar.gz
#
# Each call runs scenarios/papers/reproduce.py with --budget-s (default 500 s, so that the report
# and the tarball fit in the 10-minute limit) into results/h100, then packs that folder
# into $OUT/results.tar.gz. `unpack` puts it back into the working tree here; the next call
# carries it over (results/ is tracked, so it travels) and reproduce.py resumes where it stopped.
# RESULTS (folder), ISOLANE_BIN and REPRODUCE_ARGS (e.g. "--backend cpu", for a dry rehearsal
# here) override the defaults. Exit code: reproduce.py's (0 all studies complete, 3 budget reached: call again).
set -u
cd "$(dirname "$0")/.."

if [ "${1:-}" = "unpack" ]; then
    tarball=${2:?usage: gpu-studies.sh unpack RESULTS.tar.gz}
    tar -xzf "$tarball" -C .
    find results -name state.json -newer "$tarball" -o -name COMPLETE.json | sort
    exit 0
fi

scale=${1:-brief}
budget=${2:-500}
# One folder whatever the scale: its COMPLETE.json files record the scale, and reproduce.py reruns
# a study measured at another scale.
folder=${RESULTS:-results/h100}
out=${OUT:-/tmp/isolane-studies}
mkdir -p "$out"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,mig.mode.current \
        --format=csv,noheader | tee "$out/gpu.txt"
fi
set -o pipefail
PYTHONUNBUFFERED=1 python3 scenarios/papers/reproduce.py --scale "$scale" --out "$folder" \
    --isolane "${ISOLANE_BIN:-stage/isolane}" --budget-s "$budget" ${REPRODUCE_ARGS:-} 2>&1 | tee "$out/reproduce.log"
rc=$?
# Per-job CSVs of the sweeps are the bulk; they are kept (the tarball is compressed) unless the
# tarball would pass the 16 MiB a returned file may have.
tar -czf "$out/results.tar.gz" "$folder"
if [ "$(stat -c %s "$out/results.tar.gz")" -gt 15000000 ]; then
    echo "results.tar.gz over 15 MB: packing without per-job CSVs (summaries, traces and plots kept)"
    tar -czf "$out/results.tar.gz" --exclude='*/jobs/*.csv' "$folder"
fi
ls -la "$out"
exit $rc
