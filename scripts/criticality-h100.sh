#!/usr/bin/env bash
# Issue 14 on the H100 (docs/criticality.md), with a staged binary:
#
#   here:   bash scripts/gpu-test.sh stage     (or just: mkdir -p stage; cp target/release/isolane stage/)
#   device: (carry ["stage"])  bash scripts/criticality-h100.sh compare
#           (carry ["stage"])  bash scripts/criticality-h100.sh tradeoff
#
# compare: two critical victims (vit_b_16 in 48 SMs, resnet18 in 32) at 75 % of their alone
#   capacity with deadline 1.3 x their p99 alone, vit_l_32 flat out as best effort, under green
#   contexts and MPS with each protection lever (none / priorities / guard / both / guard with
#   the measured stretch), 3 repeats each, plus the baselines without best effort; about 6 min.
# tradeoff: the victims' load from 0.5 to 0.9 with and without protection (green), and
#   time-slicing (MECHANISMS= for none); about 6 min.
# Results under results/h100-protection/; a tarball of them (jobs CSVs included, compressed)
# in $OUT (default /tmp/isolane-criticality). ISOLANE_BIN (default stage/isolane); for compare,
# VARIANTS, MECHANISMS (default green,mps), REPEATS (default 3) and DEADLINE_BASE (alone or
# together: protection_study.py --deadline-base) override the defaults.
set -u
cd "$(dirname "$0")/.."
bin=${ISOLANE_BIN:-stage/isolane}
out=${OUT:-/tmp/isolane-criticality}
phase=${1:-compare}
mkdir -p "$out" results/h100-protection
rc=0
case "$phase" in
compare)
    rm -rf results/h100-protection/compare results/h100-protection/alone results/h100-protection/alone.json
    python3 scripts/protection_study.py --isolane "$bin" --out results/h100-protection \
        --mechanisms "${MECHANISMS:-green,mps}" --repeats "${REPEATS:-3}" --duration 3 --variants "${VARIANTS:-none,pri,guard,both,stretch}" \
        --deadline-base "${DEADLINE_BASE:-alone}" || rc=$?
    ;;
tradeoff)
    python3 scripts/protection_study.py --isolane "$bin" --out results/h100-protection/tradeoff-study \
        --mechanisms "${MECHANISMS-timeslice}" --variants none,both --repeats 1 --duration 3 \
        --loads 0.5,0.6,0.7,0.8,0.9 --tradeoff-variants "${VARIANTS:-none,both}" \
        --deadline-base "${DEADLINE_BASE:-alone}" || rc=$?
    ;;
*)
    echo "usage: $0 compare|tradeoff" >&2
    exit 2
    ;;
esac
# The per-job files apart: if they outgrow what a device call returns, the rest still does.
tar -czf "$out/criticality-$phase.tar.gz" --exclude='*/jobs/*.csv' results/h100-protection
tar -cJf "$out/criticality-$phase-jobs.tar.xz" $(find results/h100-protection -path '*/jobs/*.csv')
ls -la "$out"
exit $rc
