#!/usr/bin/env bash
# The interference matrix of issue 14 on the H100 (docs/interference.md), with a staged binary
# (the GPU machine has no Rust toolchain):
#
#   here:   bash scripts/gpu-test.sh stage
#   device: (carry ["stage"])  bash scripts/interference-h100.sh [fp16|fp32|all]
#   here:   tar -xzf /path/to/interference.tar.gz   (puts results/h100-interference back)
#
# One matrix per precision, green contexts, thread host: victims resnet18 and vit_b_16 at 50 % of
# their capacity alone in 48 SMs; neighbours flat out in 48 and in 80 SMs: resnet18, vit_l_32,
# a memory-bound STREAM triad over 1 GiB (three arrays of ~341 MiB, far past the 50 MiB L2) and
# a compute-bound fp16 tensor-core GEMM (4096³), each neighbour also alone (its own throughput
# and DRAM/SM/tensor activity). Per matrix 28 cells (8 neighbour-alone cells; per victim:
# capacity, alone, 4 neighbours × 2 sizes) of DURATION_S (default 3) seconds plus warm-up and
# model builds (~3 s a cell): about 3 minutes of GPU time; `all` runs fp16 then fp32 (about 6
# minutes, within one 10-minute call).
#
# ISOLANE_BIN (default stage/isolane), RESULTS (default results/h100-interference), DURATION_S
# and OUT (where the tarball goes, default /tmp/isolane-interference) override the defaults.
# DRY_RUN=1 prints the commands without running them. Exit code: the last failing command's.
set -u
cd "$(dirname "$0")/.."

which=${1:-fp16}
case "$which" in
fp16 | fp32) precisions=$which ;;
all) precisions="fp16 fp32" ;;
*)
    echo "usage: interference-h100.sh [fp16|fp32|all] (got \`$which\`)" >&2
    exit 2
    ;;
esac
bin=${ISOLANE_BIN:-stage/isolane}
results=${RESULTS:-results/h100-interference}
duration=${DURATION_S:-3}
out=${OUT:-/tmp/isolane-interference}
mkdir -p "$results" "$out"

# Runs a command (or prints it with DRY_RUN=1) and logs it with its time and exit code.
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
for p in $precisions; do
    run "$bin" interference --backend cuda --mechanism green \
        --victim-size 48 --neighbour-sizes 48,80 \
        --victims resnet18,vit_b_16 \
        --neighbours resnet18,vit_l_32,kernel:triad:1GiB,kernel:gemm:4096:fp16 \
        --precisions "$p" --victim-load 0.5 --neighbour-alone \
        --duration-s "$duration" --warmup 20 --quiet --force \
        --out "$results/green-$p" || rc=$?
done
run "$bin" report "$results" --out "$results/report.html" || rc=$?

if [ -z "${DRY_RUN:-}" ]; then
    tar -czf "$out/interference.tar.gz" "$results"
    # A returned file may have 16 MiB: without the per-job CSVs (the summaries, the matrix and
    # the report are what the docs need) when the tarball would not fit.
    if [ "$(stat -c %s "$out/interference.tar.gz")" -gt 15000000 ]; then
        echo "interference.tar.gz over 15 MB: packing without per-job CSVs"
        tar -czf "$out/interference.tar.gz" --exclude='*/jobs/*.csv' "$results"
    fi
    ls -la "$out"
fi
exit $rc
