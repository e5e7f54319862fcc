#!/bin/bash
# What delays 1-4 % of jobs by ~1 ms when staggered jobs do not overlap: telemetry (NVML) or not?
mkdir -p /tmp/f
run() { # label scenario telemetry_period_ms
  d=/tmp/f/$1
  ISOLANE_TELEMETRY_PERIOD_MS=$3 timeout 100 ./stage/isolane run stage/exp/$2.toml -o $d -q > $d.log 2>&1 || { echo "$1 failed"; tail -5 $d.log; }
  python3 stage/exp/f.py "$d" "$1"
}
run stagger-t50 f-stagger 50
run stagger-toff f-stagger 600000
run inphase-toff f-inphase 600000
run stagger-t50.2 f-stagger 50
run heavy-toff f-heavy 600000
run heavy-t50 f-heavy 50
run stagger-t10 f-stagger 10
tar czf $OUT/f.tgz -C /tmp f
