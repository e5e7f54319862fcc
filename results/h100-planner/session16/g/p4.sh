#!/bin/bash
# heavy-inspection planned from the same profiles, no learned interference: in phase, then staggered.
rm -rf /tmp/isolane-plan
export PROFILES=stage/prof3
timeout 270 bash scripts/gpu-test.sh plan heavy-inspection > $OUT/plan-keep.log 2>&1; echo "rc $?"
mkdir -p /tmp/keep && cp /tmp/isolane-plan/*heavy* /tmp/keep/ -r 2>/dev/null
PLAN_ARGS="--phases stagger" timeout 270 bash scripts/gpu-test.sh plan heavy-inspection > $OUT/plan-stagger.log 2>&1; echo "rc $?"
mv /tmp/keep /tmp/isolane-plan/keep
tar czf $OUT/plan.tgz -C /tmp/isolane-plan --exclude='*.csv' . 2>/dev/null
for f in $OUT/plan-keep.log $OUT/plan-stagger.log; do echo "##### $f"; grep -h -E "^===|^exit|release phases|holds|NOT|round|^[a-z_]+ +[0-9.]+ +[0-9.]+ +-?[0-9]+%" $f | head -40; done
grep -h -E "planned in|^  [a-z_]+ +[0-9]+ SMs" /tmp/isolane-plan/keep/*.err /tmp/isolane-plan/plan-heavy*.err | head -40
