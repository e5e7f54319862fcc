import csv, json, sys, os, bisect
d, label = sys.argv[1], sys.argv[2]
s = json.load(open(d + "/summary.json"))
tel = []
tp = d + "/telemetry.csv"
if os.path.exists(tp):
    for r in csv.DictReader(open(tp)):
        tel.append(float(r["t_s"]) * 1e3)
tel.sort()
for w in s["workloads"]:
    l = w["latency_ms"]
    rows = list(csv.DictReader(open(f"{d}/jobs/{w['name']}.csv")))
    lat = [float(r["latency_ms"]) for r in rows if r["latency_ms"]]
    slow = [r for r in rows if r["latency_ms"] and float(r["latency_ms"]) > l["p50"] + 0.25]
    late = [float(r["start_ms"]) - float(r["release_ms"]) for r in slow]
    gpu = [float(r["end_ms"]) - float(r["start_ms"]) for r in slow]
    near = 0
    for r in slow:
        a, b = float(r["release_ms"]) - 1.0, float(r["end_ms"])
        i = bisect.bisect_left(tel, a)
        near += i < len(tel) and tel[i] <= b
    m = lambda v: sum(v) / len(v) if v else 0
    print(f"{label:14} {w['name']:8} p50 {l['p50']:.3f} p90 {l['p90']:.3f} p99 {l['p99']:.3f} p999 {l['p999']:.3f} to {w['timeout_pct']:.2f}% "
          f"slow {len(slow)} (start late {m(late):.3f}, exec {m(gpu):.3f}) near a sample {near} of {len(slow)}; samples {len(tel)}")
