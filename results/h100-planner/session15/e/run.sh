#!/bin/bash
# Cameras (resnet18, mobilenet_v2 at 16 SMs each, 100 Hz) alone and beside three neighbours in
# 72 SMs: resnet50 b64 (38.5 MB input copy per job), a triad (memory-bound, no copy), a GEMM.
mkdir -p /tmp/exp
for e in e0-alone e1-resnet50b64 e2-triad e3-gemm e1-resnet50b64; do
  d=/tmp/exp/$e.$RANDOM
  timeout 100 ./stage/isolane run stage/exp/$e.toml -o $d -q > $d.log 2>&1 || { echo "$e failed"; tail -5 $d.log; }
  python3 - "$d" "$e" <<'PY'
import json,sys
s=json.load(open(sys.argv[1]+"/summary.json"))
for w in s["workloads"]:
    l=w["latency_ms"]
    print(f"{sys.argv[2]:16} {w['name']:8} p50 {l['p50']:.3f} p99 {l['p99']:.3f} p999 {l['p999']:.3f} max {l['max']:.3f} timeouts {w['timeout_pct']:.2f}%")
PY
done
tar czf $OUT/exp.tgz --exclude='*.csv' -C /tmp exp
