#!/bin/bash
# Late starts (host side) in a staggered plan: with and without the telemetry sampler.
mkdir -p /tmp/i
for k in 1 2 3; do for t in 50 600000; do
  d=/tmp/i/t$t.$k
  ISOLANE_TELEMETRY_PERIOD_MS=$t ./stage/isolane run stage/exp/i.toml -o $d -q > $d.log 2>&1 || echo "failed $d"
  python3 - "$d" "t$t.$k" <<'PY'
import csv, json, sys, bisect
d, label = sys.argv[1], sys.argv[2]
s = json.load(open(d + "/summary.json"))
tel = []
try:
    tel = sorted(float(r["t_s"]) * 1e3 for r in csv.DictReader(open(d + "/telemetry.csv")))
except FileNotFoundError:
    pass
out = []
late_all = []
for w in s["workloads"]:
    rows = list(csv.DictReader(open(f"{d}/jobs/{w['name']}.csv")))
    late = [(float(r["start_ms"]) - float(r["release_ms"]), float(r["release_ms"])) for r in rows if r["start_ms"]]
    big = [(l, t) for l, t in late if l > 0.1]
    late_all += [t for _, t in big]
    near = sum(1 for l, t in big if (lambda i: i < len(tel) and tel[i] <= t + 0.5)(bisect.bisect_left(tel, t - 60)))
    out.append(f"{w['name']} to {w['timeout_pct']:.2f}% late>0.1ms {len(big)} max {max(l for l,_ in late):.3f} near-sample {near}")
late_all.sort()
print(label, "steal", round(s.get("cpu_steal_pct", 0), 3), "|", "; ".join(out), "| late release times (ms):", [round(t) for t in late_all[:12]])
PY
done; done
tar czf $OUT/i.tgz -C /tmp i
