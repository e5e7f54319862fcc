#!/bin/bash
# The final binary end to end: heavy-inspection in phase (its note), then staggered, from profiles alone.
rm -rf /tmp/isolane-plan /tmp/p6; mkdir -p /tmp/p6/cache; cp -r stage/prof5/. /tmp/p6/cache/; rm -rf /tmp/p6/cache/*/*/stretch
s=scenarios/planner/heavy-inspection.toml
./stage/isolane plan --auto $s --profile-cache /tmp/p6/cache > /tmp/p6/keep.toml 2> /tmp/p6/keep.err; echo "keep (no verify) exit $?"
grep -E "^note|planned in|SMs  p99" /tmp/p6/keep.err
./stage/isolane plan --auto $s --profile-cache /tmp/p6/cache --phases stagger -o /tmp/p6/stagger.toml --verify --verify-out /tmp/p6/v > /tmp/p6/stagger.txt 2> /tmp/p6/stagger.err; echo "stagger exit $?"
grep -E "release phases|planned in|SMs  p99" /tmp/p6/stagger.err; cat /tmp/p6/stagger.txt
./stage/isolane run /tmp/p6/stagger.toml -o /tmp/p6/run -q > /tmp/p6/run.log 2>&1; echo "run of the planned file exit $?"
python3 - <<'PY'
import json
s=json.load(open("/tmp/p6/run/summary.json"))
for w in s["workloads"]:
    l=w["latency_ms"]; print(f"{w['name']:8} p50 {l['p50']:.3f} p99 {l['p99']:.3f} p999 {l['p999']:.3f} timeouts {w['timeout_pct']:.2f}%")
PY
tar czf $OUT/p8.tgz --exclude='*.csv' -C /tmp p6
