#!/usr/bin/env bash
# `isolane serve` measured on the GPU machine (issue 32): what serving adds per request against
# the same model in-process, the critical model's tail while the best-effort models are flooded,
# and deadlines below what a model can do refused up front. scripts/serve_bench.py drives it.
# The GPU machine has no Rust toolchain and no registry: the binary and the clients' wheels
# (tritonclient, perf_analyzer and their needs missing there) are staged here and carried.
#
#   scripts/serve-bench.sh stage          # here: release isolane (stripped, xz) and the clients
#                                         # installed for the GPU machine's Python 3.12 (xz) into
#                                         # stage-serve/ (git-ignored; about 16 MiB; the carry
#                                         # limit, 64 MiB, counts the tracked tree too)
#   (device run, carry ["stage-serve"])  bash scripts/serve-bench.sh run [DRIVER ARGS...]
#                                         # there: clients unpacked into /tmp, the driver on
#                                         # scenarios/serve/h200.toml; $OUT gets summary.md,
#                                         # summary.json, gpu.txt and serve-bench.tgz (the logs,
#                                         # perf_analyzer's CSVs, the in-process runs)
#
# One device call measures everything in about 3 minutes: the `run` tool with command
# `bash scripts/serve-bench.sh run`, carry ["stage-serve"], timeout_s 600. BENCH_TIMEOUT
# (default 540 s) stops the driver, which then stops the server; what was measured is still
# written. Driver arguments: `python3 scripts/serve_bench.py --help` (e.g. --steps
# overhead,critical; --critical-rate 500; --flood-concurrency 32; --quick: a short pass).
# SCENARIO=FILE serves another scenario. What summary.md's tables mean:
#   overhead  `isolane run` of the critical model alone at rate "max" in its partition (24 SMs)
#             is the in-process baseline; perf_analyzer at concurrency 1 gives the added µs at
#             p50 (target <= 50 for gRPC) and the server's stages; the sweep over
#             --concurrencies (1,2,4,8) the best throughput / in-process (target >= 90 %) with
#             the concurrency it took and its p50/p99, over gRPC and HTTP (binary data), gRPC
#             with system shared memory (`grpc-shm`) and gRPC streaming (`grpc-stream`:
#             ModelStreamInfer, perf_analyzer's --streaming; --no-stream leaves it out), each
#             perf_analyzer run in windows of --pa-window-ms (1000); tritonclient's rows
#             (start_stream for grpc-stream) include Python's own client time. Then, the main server stopped, one server of the probe alone per
#             --ab-spin-us value (0,2000) with [timing] spin_us set to it, at concurrency 1:
#             the spin A/B (docs/serve.md, "Waiting for answers").
#             The sweep's levels above 1, the shared memory rows and the A/B servers start
#             only within the driver's --budget-s (250 s; scripts/session-gpu.sh gives the
#             overhead step 300 s): what is left out for time is listed in summary.md.
#   floor     (--steps ...,floor; session-gpu.sh's overhead step) after the main server, a server
#             of the probe and its floor (a GlobalAveragePool ONNX of the probe's input shape that
#             the driver writes): both at concurrency 1 over gRPC, HTTP, grpc-shm and grpc-stream, the floor
#             in-process too, so that the added p50 splits into the protocol floor (client,
#             socket and server plumbing for the same body) and the model path above it; and
#             the probe in-process at gRPC's concurrency-1 rate (its job with the GPU idle
#             between jobs, against back to back).
#   critical  the critical model's client latency and its refused and late requests, alone and
#             while perf_analyzer floods both best-effort models (their rows/s from /metrics).
#   deadline  refused up front (429 / RESOURCE_EXHAUSTED) against answered late: late must be 0.
#
# On the CPU, to check the kit (perf_analyzer's binary needs glibc 2.38: without it, give no
# PERF_ANALYZER, and Python threads flood instead):
#   python3 -m venv /tmp/sbvenv && /tmp/sbvenv/bin/pip install 'tritonclient[grpc,http]'
#   STAGED_CLIENTS=0 PYTHON=/tmp/sbvenv/bin/python ISOLANE=target/debug/isolane \
#     SCENARIO=scenarios/serve/cpu-spin.toml scripts/serve-bench.sh run --quick
# (or, with the staged clients themselves: PYTHON=a Python 3.12 venv with numpy, ml_dtypes,
# packaging, typing_extensions, urllib3 and certifi, as the GPU machine's image has.)
set -euo pipefail
cd "$(dirname "$0")/.."

# The clients' wheels, pinned (one version each). The GPU machine has
# numpy, urllib3, certifi, ml-dtypes and aiohttp; tritonclient's gRPC code needs grpcio >= 1.81.1
# and protobuf >= 6.33.5, newer than the image may hold, so both are carried too.
PINNED=(
    tritonclient==2.73.0 perf-analyzer==2.60.0 grpcio==1.85.3 protobuf==6.33.6
    python-rapidjson==1.25 geventhttpclient==2.6.1 gevent==26.9.0 greenlet==3.3.2
    zope.event==6.2 zope.interface==8.7 brotli==1.2.1
)

stage() {
    rm -rf stage-serve && mkdir -p stage-serve
    cargo build --release --bin isolane
    cp target/release/isolane stage-serve/isolane
    strip stage-serve/isolane 2>/dev/null || true
    if ! ./stage-serve/isolane serve --help | grep -q -- --grpc; then
        echo "stage: this isolane has no \`serve --grpc\`; only HTTP would be measured" >&2
    fi
    xz -T0 -6 stage-serve/isolane
    # The clients, installed here for the GPU machine (x86-64, glibc 2.39, Python 3.12:
    # /work/.library/device) and carried as one archive: xz packs the stripped libraries in
    # about half the size of the wheels, and nothing is installed there. pip matches each
    # manylinux tag exactly, hence the list.
    local plat=() n site
    site=$(mktemp -d)
    for n in 39 38 35 34 31 28 27 24 17; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
    python3 -m pip install -q --no-deps --no-compile --only-binary=:all: --python-version 3.12 \
        --implementation cp "${plat[@]}" --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 --target "$site" "${PINNED[@]}"
    rm -rf "$site/bin" "$site/gevent/tests"
    find "$site" -name '*.so' -exec strip --strip-unneeded {} +
    strip "$site/perf_analyzer/bin/perf_analyzer"
    tar cJf stage-serve/site.tar.xz -C "$site" .
    rm -rf "$site"
    du -sh stage-serve/*
    # What travels: the tracked tree (about 36 MiB in session 18) and stage-serve, 64 MiB in all.
    git ls-files -z | xargs -0 stat -c %s | awk -v s="$(du -sb stage-serve | cut -f1)" \
        '{t += $1} END {printf "carried: %.1f MiB of 64 (tree %.1f, stage-serve %.1f)\n", (t + s) / 1048576, t / 1048576, s / 1048576}'
}

run() {
    local out=${OUT:-/tmp/isolane-serve-bench} work=/tmp/serve-bench status=0
    local python=${PYTHON:-python3} isolane=${ISOLANE:-} pa=${PERF_ANALYZER:-}
    mkdir -p "$out"
    rm -rf "$work" && mkdir -p "$work"
    if [ -z "$isolane" ]; then
        if [ -f stage-serve/isolane.xz ]; then
            xz -dc stage-serve/isolane.xz >"$work/isolane" && chmod +x "$work/isolane"
            isolane=$work/isolane
        else
            echo "run: no stage-serve/isolane.xz (scripts/serve-bench.sh stage, carry stage-serve)" >&2
            return 2
        fi
    fi
    if [ "${STAGED_CLIENTS:-1}" != 0 ]; then
        if [ ! -f stage-serve/site.tar.xz ]; then
            echo "run: no stage-serve/site.tar.xz (scripts/serve-bench.sh stage, carry stage-serve)" >&2
            return 2
        fi
        mkdir -p "$work/site" && tar xJf stage-serve/site.tar.xz -C "$work/site"
        export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"
        if [ -z "$pa" ] && [ -f "$work/site/perf_analyzer/bin/perf_analyzer" ]; then
            pa=$work/site/perf_analyzer/bin/perf_analyzer
            chmod +x "$pa"
            # It needs glibc 2.38, libssl 3 and zlib from the machine: what is missing is said
            # here (the driver then goes on without it).
            ldd "$pa" 2>&1 | grep -i 'not found' && echo "run: perf_analyzer lacks the libraries above" || true
        fi
    fi
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,mig.mode.current --format=csv \
        >"$out/gpu.txt" 2>&1 || echo "no nvidia-smi" >"$out/gpu.txt"
    cat "$out/gpu.txt"
    mkdir -p "$work/results"
    local args=(--isolane "$isolane" --scenario "${SCENARIO:-scenarios/serve/h200.toml}" --out "$work/results")
    [ -n "$pa" ] && args+=(--perf-analyzer "$pa")
    # The driver stops its server on SIGTERM (timeout's); KILL follows 60 s later if it hangs.
    PYTHONUNBUFFERED=1 timeout -k 60 "${BENCH_TIMEOUT:-540}" "$python" scripts/serve_bench.py \
        "${args[@]}" "$@" 2>&1 | tee "$work/results/driver.log" || status=$?
    # A server or flood the driver could not stop (each in a session of its own, named by its
    # pid file) is not left running.
    local f pid
    for f in "$work/results"/*.pid; do
        [ -f "$f" ] || continue
        pid=$(cat "$f")
        # Still ours (not a pid reused since): its command line names isolane or perf_analyzer.
        if kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qE 'isolane|perf_analyzer'; then
            echo "run: $(basename "$f" .pid) ($pid) outlived the driver: killed" | tee -a "$work/results/driver.log"
            kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
        fi
    done
    cp "$work/results/summary.md" "$work/results/summary.json" "$out/" 2>/dev/null || status=1
    tar czf "$out/serve-bench.tgz" -C "$work" results
    return "$status"
}

case "${1:-}" in
    stage) stage ;;
    run) shift; run "$@" ;;
    *) echo "usage: $0 stage | run [DRIVER ARGS...]" >&2; exit 2 ;;
esac
