#!/usr/bin/env bash
# Build here, stage, run there. The GPU machine has no Rust toolchain, so:
#
#   scripts/gpu-test.sh stage            # here: release build of the binary and of every test
#                                        # binary, debug info stripped, copied into ./stage
#   (device run, carry ["stage"])  bash scripts/gpu-test.sh run [FILTER...]
#                                        # there: runs each staged test binary with --ignored
#                                        # (the GPU tests) and the reference checks; logs to $OUT
#
# ./stage is git-ignored and must stay under the 64 MiB carry limit.
set -euo pipefail
cd "$(dirname "$0")/.."

stage() {
    rm -rf stage && mkdir -p stage/tests
    cargo build --release --bin isolane
    cp target/release/isolane stage/isolane
    # Test binaries: ask cargo for their paths instead of guessing hashed names.
    # STAGE_PACKAGES="-p isolane-gpu" stages only those crates' tests (default: all).
    # shellcheck disable=SC2086
    cargo test --release ${STAGE_PACKAGES:---workspace} --no-run --message-format=json 2>/dev/null |
        python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        # Prefix the crate folder name
        # so that tests/gpu.rs of two crates do not overwrite each other in stage/.
        pkg = m["manifest_path"].split("/")[-2]
        print(pkg + "--" + m["target"]["name"], m["executable"])
' | while read -r name exe; do cp "$exe" "stage/tests/$name"; done
    strip stage/isolane stage/tests/* 2>/dev/null || true
    du -sh stage
}

run() {
    out=${OUT:-/tmp/isolane-out}
    mkdir -p "$out"
    export ISOLANE_BIN="$PWD/stage/isolane"
    nvidia-smi --query-gpu=name,driver_version,memory.total,mig.mode.current --format=csv | tee "$out/gpu.txt"
    status=0
    for t in stage/tests/*; do
        name=$(basename "$t")
        # Filters match a whole staged name or its part after "--" (the test target).
        if [ "$#" -gt 0 ] && ! printf '%s\n' "$@" | grep -qx -e "$name" -e "${name#*--}"; then continue; fi
        echo "=== $name (--ignored)"
        if ! "$t" --ignored --test-threads=1 --nocapture 2>&1 | tee "$out/test-$name.log" | tail -n 60; then status=1; fi
    done
    return $status
}

# There: isolane's cuda backend and PyTorch (eager, CUDA graphs) on the same models, batches
# and precisions, in one call, then one table with the ratios.
#   bash scripts/gpu-test.sh bench [MODELS] [BATCHES] [PRECISIONS] [REPLAYS]
bench() {
    out=${OUT:-/tmp/isolane-out}
    mkdir -p "$out"
    models=${1:-resnet18,resnet50,mobilenet_v2,convnext_base,convnext_large,vit_b_16,vit_l_32}
    batches=${2:-1}
    precs=${3:-fp16,tf32}
    replays=${4:-200}
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee "$out/gpu.txt"
    ./stage/isolane bench --model "$models" --batch "$batches" --precision "$precs" \
        --replays "$replays" --json | tee "$out/ours.jsonl"
    PYTHONUNBUFFERED=1 python3 bench/pytorch_baseline.py --models "$models" --batch "$batches" \
        --precisions "$precs" --replays "$replays" --ours "$out/ours.jsonl" | tee "$out/table.txt"
}

case "${1:-}" in
    stage) stage ;;
    run) shift; run "$@" ;;
    bench) shift; bench "$@" ;;
    *) echo "usage: $0 stage | run [TEST_BINARY_NAME...] | bench [MODELS] [BATCHES] [PRECISIONS] [REPLAYS]" >&2; exit 2 ;;
esac
