#!/usr/bin/env bash
# isolane's ONNX conformance suite (scripts/conformance/suite.py; docs/onnx.md, "Conformance
# suite"): 50 torchvision/timm models (and yolov8n with Ultralytics), each exported by PyTorch's classic exporter (opset 17)
# and its default one (dynamo, opset 18+), run by `isolane infer` on cpu (fp32) and cuda
# (fp32/tf32/fp16/bf16), compared with onnxruntime's CPU output; one markdown table.
#
#   bash scripts/conformance.sh stage
#       here (dev machine, PyPI reachable): release build of isolane into ./stage/isolane, and
#       pinned pure-Python wheels into ./stage/pywheels, since the GPU machine has PyTorch but
#       no network: onnxscript and onnx-ir (the default exporter) and ultralytics and
#       ultralytics-thop (yolov8n; the machine has its other needs: cv2, yaml, matplotlib...).
#   STAGE=DIR (default stage): the staged folder that stage writes and run reads (DIR/isolane,
#       DIR/pywheels), e.g. a copy of an existing build in a git-ignored folder of your own.
#   (device run, carry ["stage"] (or STAGE's folder); add "conformance-results" only where it
#   exists here: a carried path that is missing here is deleted there)
#   bash scripts/conformance.sh run [suite.py options]
#       there: for each of onnxscript and ultralytics that does not import, extracts its staged
#       wheels into /tmp/isolane-conformance/pydeps (on PYTHONPATH), runs the suite with a 420 s
#       budget (BUDGET; one call stays under ~8 minutes; run it again to continue: exports are
#       cached in /tmp/isolane-conformance/work while the machine is warm, results are kept in
#       ./conformance-results), and writes $OUT/conformance.md, $OUT/conformance.log and
#       $OUT/conformance-results.tgz (one JSON per case: more files than $OUT returns one by
#       one; here `tar xzf conformance-results.tgz` gives ./conformance-results to carry back
#       and resume on a fresh machine).
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
STAGE=${STAGE:-stage}

stage() {
    mkdir -p "$STAGE/pywheels"
    cargo build --release --bin isolane
    cp target/release/isolane "$STAGE/isolane"
    strip "$STAGE/isolane" 2>/dev/null || true
    # Pure-Python wheels (py3-none-any): onnxscript and onnx-ir pinned to what PyTorch 2.11's
    # exporter was tested with; ultralytics and its thop as checked importable on the GPU machine.
    "$PY" -m pip download --no-deps --only-binary=:all: -d "$STAGE/pywheels" \
        "onnxscript==0.7.*" "onnx-ir==1.1.*" "ultralytics==8.4.190" "ultralytics-thop==2.2.3"
    du -sh "$STAGE"
}

# A module that must import there, and the staged wheels (name prefixes) that provide it.
PYDEPS="onnxscript:onnxscript,onnx_ir ultralytics:ultralytics,ultralytics_thop"

ensure_pydeps() {
    local deps=/tmp/isolane-conformance/pydeps entry mod prefix whl found
    for entry in $PYDEPS; do
        mod=${entry%%:*}
        # Installed, or extracted by an earlier call on this machine.
        if PYTHONPATH="$deps${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c "import $mod" 2>/dev/null; then continue; fi
        # Pure-Python wheels are zip files laid out for site-packages: extracting them is
        # installing them (no pip needed there).
        found=""
        for prefix in $(echo "${entry#*:}" | tr , ' '); do
            for whl in "$STAGE/pywheels/$prefix"-[0-9]*.whl; do
                [ -f "$whl" ] || continue
                mkdir -p "$deps"
                "$PY" -m zipfile -e "$whl" "$deps"
                found=1
            done
        done
        [ -n "$found" ] || echo "$mod is not installed and $STAGE/pywheels has no wheel of it;" \
            "run 'bash scripts/conformance.sh stage' where PyPI is reachable" >&2
    done
    if [ -d "$deps" ]; then export PYTHONPATH="$deps${PYTHONPATH:+:$PYTHONPATH}"; fi
}

run_suite() {
    local bin=$1
    shift
    local out=${OUT:-/tmp/isolane-conformance/out}
    mkdir -p "$out" "$RESULTS"
    ensure_pydeps
    status=0
    "$PY" scripts/conformance/suite.py --isolane "$bin" --results "$RESULTS" \
        --table "$out/conformance.md" --budget "${BUDGET:-420}" "$@" 2>&1 | tee "$out/conformance.log" || status=$?
    rm -rf "$out/conformance-results" "$out/conformance-results.tgz"
    tar czf "$out/conformance-results.tgz" -C "$(dirname "$RESULTS")" "$(basename "$RESULTS")"
    return $status
}

case "${1:-}" in
    stage) stage ;;
    run) shift; run_suite "$PWD/$STAGE/isolane" "$@" ;;
    local) shift; run_suite "${ISOLANE_BIN:-$PWD/target/release/isolane}" "$@" ;;
    *) sed -n '2,31p' "$0"; exit 2 ;;
esac
