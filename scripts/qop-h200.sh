#!/usr/bin/env bash
# QOperator-format ONNX files (issue 33) on the GPU machine: every fixture of
# crates/isolane-engine/tests/fixtures/onnx/qop/ (onnxruntime's quantize_static QOperator and
# quantize_dynamic models, and hand-made ones on rounding ties) run by `isolane infer` on cuda
# at fp32 and fp16, against the CPU backend and onnxruntime's output (<name>.output.npy).
# The lowering holds integers in f32, so cuda at fp32 may give the CPU's bits (integer sums
# are exact in any order below 2^24); fp16 shows how far half precision moves them.
# Staged build as scripts/gpu-test.sh makes it (carry ["stage"]): stage/isolane, or
# ISOLANE_BIN. Needs python3 (standard library only). Under 1 minute. qop.md goes to $OUT.
set -u
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/qop}
mkdir -p "$out"
for f in stage/*.xz; do
    [ -f "$f" ] && xz -d -f "$f" && chmod +x "${f%.xz}"
done
bin=${ISOLANE_BIN:-$PWD/stage/isolane}
dir=crates/isolane-engine/tests/fixtures/onnx/qop
tmp=$(mktemp -d)
md=$out/qop.md
{
    echo "# QOperator fixtures on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
    echo
    echo "Elements equal (bits) / max |difference|, against the CPU backend and against onnxruntime."
    echo
    echo "| fixture | cuda fp32 vs cpu | cuda fp32 vs onnxruntime | cuda fp16 vs onnxruntime |"
    echo "| --- | --- | --- | --- |"
} >"$md"
compare() {
    python3 - "$1" "$2" <<'PY'
import struct, sys
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<H", b[8:10])[0] if b[6] == 1 else struct.unpack("<I", b[8:12])[0]
    start = (10 if b[6] == 1 else 12) + n
    return struct.unpack("<%df" % ((len(b) - start) // 4), b[start:])
a, b = load(sys.argv[1]), load(sys.argv[2])
if len(a) != len(b):
    print("sizes differ (%d, %d)" % (len(a), len(b)))
else:
    eq = sum(struct.pack("<f", x) == struct.pack("<f", y) for x, y in zip(a, b))
    print("%d / %d, max %.3g" % (eq, len(a), max((abs(x - y) for x, y in zip(a, b)), default=0)))
PY
}
for onnx in "$dir"/*.onnx; do
    name=$(basename "$onnx" .onnx)
    row="| $name"
    ok=1
    for cfg in "cpu fp32" "cuda fp32" "cuda fp16"; do
        set -- $cfg
        if ! timeout 60 "$bin" infer --model "$onnx" --input "$dir/$name.input.npy" --backend "$1" \
            --precision "$2" --save-output "$tmp/$name.$1.$2.npy" >"$out/$name.$1.$2.log" 2>&1; then
            ok=0
            row="$row | $1 $2 FAILED: $(tail -c 160 "$out/$name.$1.$2.log" | tr '\n|' '  ')"
        fi
    done
    if [ $ok = 1 ]; then
        row="$row | $(compare "$tmp/$name.cuda.fp32.npy" "$tmp/$name.cpu.fp32.npy")"
        row="$row | $(compare "$tmp/$name.cuda.fp32.npy" "$dir/$name.output.npy")"
        row="$row | $(compare "$tmp/$name.cuda.fp16.npy" "$dir/$name.output.npy")"
    fi
    echo "$row |" >>"$md"
done
cat "$md"
