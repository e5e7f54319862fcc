#!/usr/bin/env bash
# isolane's ONNX conformance suite (scripts/conformance/suite.py; docs/onnx.md, "Conformance
# suite"): 40+ torchvision/timm models, each exported by PyTorch's classic exporter (opset 17)
# and its default one (dynamo, opset 18+), run by `isolane infer` on cpu (fp32) and cuda
# (fp32/tf32/fp16/bf16), compared with onnxruntime's CPU output; one markdown table.
#
#   bash scripts/conformance.sh stage
#       here (dev machine, PyPI reachable): release build of isolane into ./stage/isolane, and
#       the pure-Python wheels the default exporter needs (onnxscript, onnx-ir) into
#       ./stage/pywheels, since the GPU machine has PyTorch but not onnxscript and no network.
#   (device run, carry ["stage", "conformance-results"])
#   bash scripts/conformance.sh run [suite.py options]
#       there: installs the staged wheels into /tmp/isolane-conformance/pydeps where onnxscript
#       is missing, runs the suite with a 420 s budget (one call stays under ~8 minutes; run it
#       again to continue: exports are cached in /tmp/isolane-conformance/work while the
#       machine is warm, results are kept in ./conformance-results), and writes
#       $OUT/conformance.md and $OUT/conformance-results/ (carry them back to resume on a fresh
#       machine).
#   bash scripts/conformance.sh local [suite.py options]
#       here: the same with target/release/isolane (or ISOLANE_BIN) and the Python found, e.g.
#       --backends cpu --models small.
#
# Examples:  bash scripts/conformance.sh run --models torchvision
#            bash scripts/conformance.sh run --models resnet18,timm/levit_128s --precisions fp16
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
RESULTS=${RESULTS:-conformance-results}

stage() {
    mkdir -p stage/pywheels
    cargo build --release --bin isolane
    cp target/release/isolane stage/isolane
    strip stage/isolane 2>/dev/null || true
    # Pure-Python wheels (py3-none-any), pinned to what PyTorch 2.11's exporter was tested with.
    "$PY" -m pip download --no-deps --only-binary=:all: -d stage/pywheels \
        "onnxscript==0.7.*" "onnx-ir==1.1.*"
    du -sh stage
}

ensure_onnxscript() {
    if "$PY" -c 'import onnxscript' 2>/dev/null; then return; fi
    local deps=/tmp/isolane-conformance/pydeps
    if [ ! -d "$deps/onnxscript" ]; then
        if ! ls stage/pywheels/*.whl >/dev/null 2>&1; then
            echo "onnxscript is not installed and stage/pywheels has no wheels: the default (dynamo) exporter will fail;" \
                 "run 'bash scripts/conformance.sh stage' where PyPI is reachable" >&2
            return
        fi
        "$PY" -m pip install --quiet --no-index --no-deps --target "$deps" stage/pywheels/*.whl
    fi
    export PYTHONPATH="$deps${PYTHONPATH:+:$PYTHONPATH}"
}

run_suite() {
    local bin=$1
    shift
    local out=${OUT:-/tmp/isolane-conformance/out}
    mkdir -p "$out" "$RESULTS"
    ensure_onnxscript
    status=0
    "$PY" scripts/conformance/suite.py --isolane "$bin" --results "$RESULTS" \
        --table "$out/conformance.md" --budget "${BUDGET:-420}" "$@" 2>&1 | tee "$out/conformance.log" || status=$?
    rm -rf "$out/conformance-results"
    cp -r "$RESULTS" "$out/conformance-results"
    return $status
}

case "${1:-}" in
    stage) stage ;;
    run) shift; run_suite "$PWD/stage/isolane" "$@" ;;
    local) shift; run_suite "${ISOLANE_BIN:-$PWD/target/release/isolane}" "$@" ;;
    *) sed -n '2,27p' "$0"; exit 2 ;;
esac
