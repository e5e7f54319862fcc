#!/usr/bin/env bash
# Issue 14 on the H100 (docs/criticality.md, docs/interference.md), with a staged binary:
#
#   here:   bash scripts/gpu-test.sh stage
#   device: (carry ["stage"])  bash scripts/criticality-h100.sh
#
# 1. The protection comparison (scripts/protection_study.py): two critical victims (vit_b_16 in
#    48 SMs, resnet18 in 32) at 75 % of their alone capacity with deadline 1.3 x their p99 alone,
#    vit_l_32 flat out as best effort, under green / MPS / time-slicing, unprotected and
#    protected; then the victim-load trade-off. -> results/h100-protection
# 2. Where the stretch comes from: the resnet18 cells of the matrix whose stretch was bimodal
#    (1.06x or 1.47x for neighbours of the same kind), repeated, and with the driver's hardware
#    work queues per context forced to 1 and to 32 (CUDA_DEVICE_MAX_CONNECTIONS).
#    -> results/h100-interference/frontend-*
# About 6 minutes of GPU time. ISOLANE_BIN (default stage/isolane), OUT (tarball folder).
set -u
cd "$(dirname "$0")/.."
bin=${ISOLANE_BIN:-stage/isolane}
out=${OUT:-/tmp/isolane-criticality}
mkdir -p "$out" results/h100-protection results/h100-interference
rc=0
python3 scripts/protection_study.py --isolane "$bin" --out results/h100-protection \
    --duration 3 --loads 0.5,0.6,0.9 || rc=$?
cells() {
    "$bin" interference --backend cuda --mechanism green --victim-size 48 \
        --neighbour-sizes 48,80 --victims resnet18 --neighbours resnet18,kernel:triad:1GiB \
        --precisions fp16 --victim-load 0.5 --duration-s 3 --warmup 20 --quiet --force \
        --out "results/h100-interference/frontend-$1" | tail -n 12 || rc=$?
}
cells repeat-1
cells repeat-2
CUDA_DEVICE_MAX_CONNECTIONS=1 cells connections-1
CUDA_DEVICE_MAX_CONNECTIONS=32 cells connections-32
tar -czf "$out/criticality.tar.gz" --exclude='*/jobs/*.csv' results/h100-protection \
    results/h100-interference/frontend-*
ls -la "$out"
exit $rc
