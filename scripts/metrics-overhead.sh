#!/usr/bin/env bash
# Start lateness with and without the live metrics endpoint (docs/observability.md): the same
# CPU scenario run alternately without and with `--metrics-addr`, the latter scraped every
# SCRAPE_S seconds (default 0.1: 20-150× more often than Prometheus would), ROUNDS times each.
# Prints per run and workload summary.json's start_lateness_us {p50, p99, max}, timeouts and
# cpu_steal_pct. The scraper (bash, a `cat` per scrape) runs on the same machine.
#
#   [SCRAPE_S=1] scripts/metrics-overhead.sh [ROUNDS]   (ISOLANE_BIN: default target/release)
set -euo pipefail
rounds=${1:-3}
repo=$(cd "$(dirname "$0")/.." && pwd)
bin=${ISOLANE_BIN:-${CARGO_TARGET_DIR:-$repo/target}/release/isolane}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/s.toml" <<'TOML'
[device]
backend = "cpu"

[timing]
start_delay_ms = 50

# One thread-hosted and one process-hosted workload, each on its own core, at rates that leave
# the cores mostly idle: what start lateness measures is the loop, not a queue.
[[workload]]
name = "thread"
model = "spin:500us"
rate_hz = 500
duration_s = 20
warmup_jobs = 20
cpu = [0]

[[workload]]
name = "process"
host = "process"
model = "spin:1ms"
rate_hz = 200
duration_s = 20
warmup_jobs = 20
cpu = [1]
TOML

# One scrape with bash's /dev/tcp (no curl needed); the body on stdout.
scrape() {
    local hostport=${1#http://}
    hostport=${hostport%/metrics}
    exec 3<>"/dev/tcp/${hostport%:*}/${hostport##*:}" || return 1
    printf 'GET /metrics HTTP/1.0\r\nHost: %s\r\n\r\n' "$hostport" >&3
    cat <&3
    exec 3<&-
}

report() {
    python3 - "$1" "$2" <<'PY'
import json, sys
s = json.load(open(sys.argv[1] + "/summary.json"))
for w in s["workloads"]:
    l = w["start_lateness_us"]
    print(f"{sys.argv[2]:8} {w['name']:8} p50 {l['p50']:7.2f} us  p99 {l['p99']:8.2f} us  "
          f"max {l['max']:9.1f} us  timeouts {w['timeouts']:4}/{w['jobs']}  "
          f"steal {s.get('cpu_steal_pct') or 0:.1f} %")
PY
}

for r in $(seq 1 "$rounds"); do
    "$bin" run "$work/s.toml" --out "$work/off-$r" --quiet >/dev/null
    report "$work/off-$r" "off"
    "$bin" run "$work/s.toml" --out "$work/on-$r" --quiet --metrics-addr 127.0.0.1:0 \
        >/dev/null 2>"$work/on-$r.err" &
    pid=$!
    url=
    while [ -z "$url" ] && kill -0 "$pid" 2>/dev/null; do
        url=$(grep -so 'http://[^ ]*/metrics' "$work/on-$r.err" || true)
        sleep 0.05
    done
    scrapes=0
    while kill -0 "$pid" 2>/dev/null; do
        scrape "$url" >/dev/null 2>&1 && scrapes=$((scrapes + 1)) || true
        sleep "${SCRAPE_S:-0.1}"
    done
    wait "$pid"
    report "$work/on-$r" "on"
    echo "         ($scrapes scrapes)"
done
