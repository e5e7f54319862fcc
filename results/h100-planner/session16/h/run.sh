#!/bin/bash
for f in stage/exp/h/[a-g]-*.toml; do
  n=$(basename $f .toml)
  ./stage/isolane plan $f > /tmp/h-$n.plan 2>&1; echo "== $n admission exit $?"
  RUST_BACKTRACE=1 timeout 90 ./stage/isolane run $f -o /tmp/h/$n > /tmp/h-$n.log 2>&1; rc=$?
  echo "== $n run exit $rc"; [ $rc -ne 0 ] && tail -8 /tmp/h-$n.log
done
dmesg 2>/dev/null | tail -5
