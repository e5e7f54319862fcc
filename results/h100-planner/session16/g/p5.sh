#!/bin/bash
rm -rf /tmp/isolane-plan
PROFILES=stage/prof3 PLAN_ARGS="--phases stagger" timeout 400 bash scripts/gpu-test.sh plan heavy-inspection > $OUT/plan-stagger.log 2>&1; echo "rc $?"
tar czf $OUT/plan.tgz -C /tmp/isolane-plan --exclude='*.csv' . 2>/dev/null
grep -h -E "^===|^exit|release phases|holds|NOT|round|^[a-z_]+ +[0-9.]+ +[0-9.]+ +-?[0-9]+%" $OUT/plan-stagger.log | head -40
grep -h -E "planned in|^  [a-z_]+ +[0-9]+ SMs|no plan" /tmp/isolane-plan/plan-heavy*.err | head -20
