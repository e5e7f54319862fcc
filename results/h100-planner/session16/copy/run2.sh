#!/bin/bash
# Copy-engine hypothesis: cameras beside resnet50 b64 (38.5 MB input a job) with the input copy
# whole, in pieces (ISOLANE_COPY_PIECE bytes), and with the cameras released 1.5 ms later.
mkdir -p /tmp/exp
run() { # label scenario piece
  d=/tmp/exp/$1
  ISOLANE_COPY_PIECE=$3 timeout 100 ./stage/isolane run stage/exp/$2.toml -o $d -q > $d.log 2>&1 || { echo "$1 failed"; tail -5 $d.log; }
  python3 - "$d" "$1" <<'PY'
import json,sys
s=json.load(open(sys.argv[1]+"/summary.json"))
for w in s["workloads"]:
    l=w["latency_ms"]
    print(f"{sys.argv[2]:14} {w['name']:8} p50 {l['p50']:.3f} p99 {l['p99']:.3f} p999 {l['p999']:.3f} max {l['max']:.3f} to {w['timeout_pct']:.2f}%")
PY
}
run alone e0-alone 0
run whole e1-resnet50b64 0
run p4M e1-resnet50b64 4194304
run p1M e1-resnet50b64 1048576
run p256K e1-resnet50b64 262144
run phase1.5 e4-phase 0
run whole.2 e1-resnet50b64 0
run p1M.2 e1-resnet50b64 1048576
run triad.p1M e2-triad 1048576
tar czf $OUT/exp.tgz --exclude='*.csv' -C /tmp exp
