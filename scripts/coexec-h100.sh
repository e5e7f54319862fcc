#!/usr/bin/env bash
# The co-execution studies of issue 17 item 5 on the H100 (docs/coexec.md), with a staged
# binary (the GPU machine has no Rust toolchain):
#
#   here:   bash scripts/gpu-test.sh stage
#   device: (carry ["stage"])  bash scripts/coexec-h100.sh paper002
#           (carry ["stage"])  bash scripts/coexec-h100.sh paper003 [BATCH...]
#   here:   tar -xzf /path/to/coexec.tar.gz   (puts results/h100-coexec back)
#
# paper002: the jobs of scenarios/gpu/coexec-kernels.toml (STREAM triad over 1 GiB, an fp16
#   8192³ GEMM, an L2-resident read, resnet50 fp16 batch 32; each ~2 s alone), every pair, under
#   timeslice, mps (100 % each), mps-provisioned (50/50) and green (64 SMs each); mig is
#   listed so that its cells say why they are skipped (no profiles, MIG off). 4 alone runs +
#   6 pairs × 4 mechanisms: 125 s on an H200 (2026-11-26).
# paper003: scenarios/gpu/coexec-resnet50-cpu-gpu.toml (resnet50 on the CPU, on the GPU at fp32
#   and at fp16) at each BATCH (default 1 8 64; the paper's range is 1 2 4 8 16 32 64), every
#   pair under timeslice, mps and green. 48–77 s per batch size on an H200 (batches 1, 8, 64:
#   199 s in all).
#
# ISOLANE_BIN (default stage/isolane), RESULTS (default results/h100-coexec) and OUT (where the
# tarball goes, default /tmp/isolane-coexec) override the defaults. DRY_RUN=1 prints the
# commands without running them. Exit code: the last failing command's.
set -u
cd "$(dirname "$0")/.."

which=${1:-}
shift || true
bin=${ISOLANE_BIN:-stage/isolane}
results=${RESULTS:-results/h100-coexec}
out=${OUT:-/tmp/isolane-coexec}
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

# The batch-1 jobs file at batch $1: `batch = B`, every `jobs = N` divided by B (at least 1).
jobs_at_batch() {
    awk -v b="$1" '
        /^batch = / { print "batch = " b; next }
        /^jobs = / { n = int($3 / b); if (n < 1) n = 1; print "jobs = " n; next }
        { print }
    ' scenarios/gpu/coexec-resnet50-cpu-gpu.toml
}

rc=0
case "$which" in
paper002)
    run "$bin" coexec scenarios/gpu/coexec-kernels.toml \
        --mechanisms timeslice,mps,mps-provisioned,green,mig --quiet --force --wide \
        --out "$results/paper002" || rc=$?
    ;;
paper003)
    batches=${*:-1 8 64}
    for b in $batches; do
        case "$b" in
        '' | *[!0-9]*)
            echo "coexec-h100.sh paper003: \`$b\` is not a batch size" >&2
            exit 2
            ;;
        esac
        jobs="$results/paper003-b$b.toml"
        jobs_at_batch "$b" >"$jobs"
        run "$bin" coexec "$jobs" --mechanisms timeslice,mps,green --quiet --force --wide \
            --out "$results/paper003-b$b" || rc=$?
    done
    ;;
*)
    echo "usage: coexec-h100.sh paper002 | paper003 [BATCH...] (got \`$which\`)" >&2
    exit 2
    ;;
esac

if [ -z "${DRY_RUN:-}" ] && command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,temperature.gpu,mig.mode.current \
        --format=csv,noheader | tee "$results/gpu.txt"
fi
run "$bin" report "$results" --out "$results/report.html" || rc=$?

if [ -z "${DRY_RUN:-}" ]; then
    tar -czf "$out/coexec.tar.gz" "$results"
    # A returned file may have 16 MiB: without the per-job CSVs when the tarball would not fit.
    if [ "$(stat -c %s "$out/coexec.tar.gz")" -gt 15000000 ]; then
        echo "coexec.tar.gz over 15 MB: packing without per-job CSVs"
        tar -czf "$out/coexec.tar.gz" --exclude='*/jobs/*.csv' "$results"
    fi
    ls -la "$out"
fi
exit $rc
