#!/usr/bin/env bash
# A PNG of a run's timeline, as the HTML report draws it (a window around the worst job, one
# lane per workload), rendered by headless Chromium: for the README and docs/observability.md.
#
#   scripts/trace-screenshot.sh RESULTS_DIR OUT.png
#
# RESULTS_DIR: a run or isolation folder (summary.json, jobs/*.csv), or a folder holding
# several (each run's timeline is stacked in the picture). The binary is $ISOLANE_BIN, else
# `isolane` on PATH, else this checkout's release build (built if missing). Chromium is
# $CHROMIUM, else /usr/bin/chromium (Debian: apt-get install -y chromium). Needs python3.
set -euo pipefail
if [ $# -ne 2 ]; then
    echo "usage: $0 RESULTS_DIR OUT.png" >&2
    exit 2
fi
dir=$1
png=$2
repo=$(cd "$(dirname "$0")/.." && pwd)
if [ -n "${ISOLANE_BIN:-}" ]; then
    bin=$ISOLANE_BIN
elif command -v isolane >/dev/null; then
    bin=isolane
else
    bin=${CARGO_TARGET_DIR:-$repo/target}/release/isolane
    [ -x "$bin" ] || (cd "$repo" && cargo build --release --quiet)
fi
chromium=${CHROMIUM:-/usr/bin/chromium}
if [ ! -x "$chromium" ]; then
    echo "no Chromium at $chromium: apt-get install -y chromium, or set CHROMIUM" >&2
    exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$bin" report "$dir" --out "$work/report.html" --title "timeline" >/dev/null

# The report's timeline figures alone, on a page their size.
python3 - "$work/report.html" "$work/timeline.html" "$work/size" <<'PY'
import re, sys
html = open(sys.argv[1], encoding="utf-8").read()
figs = re.findall(r'<figure class="plot timeline".*?</figure>', html, re.S)
if not figs:
    sys.exit("no timeline in the report: the folder has no run with jobs/*.csv")
sizes = [re.search(r'<svg[^>]*width="([\d.]+)" height="([\d.]+)"', f) for f in figs]
width = int(max(float(s.group(1)) for s in sizes)) + 20
height = int(sum(float(s.group(2)) + 30 for s in sizes)) + 20
open(sys.argv[2], "w", encoding="utf-8").write(
    '<!DOCTYPE html><html><head><meta charset="utf-8"><style>body{margin:10px;'
    'font-family:sans-serif}figure{margin:0 0 8px}figcaption{font-size:12px;color:#555}'
    '</style></head><body>' + "".join(figs) + "</body></html>")
open(sys.argv[3], "w").write(f"{width},{height}")
PY
profile=$(mktemp -d)
trap 'rm -rf "$work" "$profile"' EXIT
"$chromium" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run \
    --hide-scrollbars --user-data-dir="$profile" --window-size="$(cat "$work/size")" \
    --screenshot="$(realpath -m "$png")" "file://$work/timeline.html" 2>/dev/null
echo "timeline: $png"
