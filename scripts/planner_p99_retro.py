#!/usr/bin/env python3
# Usage: python3 scripts/planner_p99_retro.py  (reads results/h100-planner/session12*/)
# Retro-computation: the predicted p99 of a verification round from the previous round's
# measured p99, on the committed session-12 H100 runs, three ways: as made at the time (the p99
# alone × the p99.9's stretch), session 14's rule (× the previous run's p99 over its p99 alone,
# never below 1) and session 15's (+ the previous run's p99 minus its p99 alone, never below 0:
# the delay the neighbours add). Profiles: the same folder's profiles/ (p99 alone per size).
import json, re, glob, os, tomllib
base = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "results", "h100-planner")
def load(run_dir):
    sc = tomllib.load(open(f"{run_dir}/scenario.toml", "rb"))
    sm = json.load(open(f"{run_dir}/summary.json"))
    meas = {w["name"]: w["latency_ms"]["p99"] for w in sm["workloads"]}
    ws = {}
    for w in sc["workload"]:
        ws[w["name"]] = (w["model"], w["batch"], w["precision"], w["partition"]["sms"])
    return ws, meas
def alone(prof_dir, model, batch, prec, sms):
    f = glob.glob(f"{prof_dir}/*/*/{model}-b{batch}-{prec}-green-{sms}.json")
    return json.load(open(f[0]))["exec_p99_ms"] if f else None
def old_preds(logfile, round_no):
    # the "p99 pred" column of verification run `round_no` in plan-*.txt
    txt = open(logfile).read()
    parts = re.split(r"verification run (\d+):", txt)
    for i in range(1, len(parts), 2):
        if int(parts[i]) == round_no:
            rows = re.findall(r"^(\S+)\s+([\d.]+)\s+([\d.]+)\s", parts[i+1], re.M)
            return {r[0]: float(r[1]) for r in rows if r[0] != "workload"}
    return {}
pairs = [
  # (session dir, previous run, next run, log of the next run, its round number)
  ("session12", "verify-inspection-line.2", "verify-inspection-line.2.round2", "plan-inspection-line.2.txt", 2),
  ("session12", "verify-inspection-line.2.round2", "verify-inspection-line.2.round3", "plan-inspection-line.2.txt", 3),
  ("session12", "verify-three-cameras", "verify-three-cameras.2", "plan-three-cameras.2.txt", 1),
  ("session12", "verify-inspection-line", "verify-inspection-line.2", "plan-inspection-line.2.txt", 1),
  ("session12b", "verify-batch-inspection", "verify-batch-inspection.round2", "plan-batch-inspection.txt", 2),
  ("session12b", "verify-batch-inspection.round2", "verify-batch-inspection.2", "plan-batch-inspection.2.txt", 1),
]
print("| runs | workload | SMs before → after | measured p99 | as made | error | ratio (s14) | error | delay (s15) | error |")
print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
olds, ratios, delays = [], [], []
for sess, prev, nxt, log, rnd in pairs:
    d = f"{base}/{sess}"
    if not (os.path.exists(f"{d}/{prev}") and os.path.exists(f"{d}/{nxt}")):
        continue
    pw, pm = load(f"{d}/{prev}")
    nw, nm = load(f"{d}/{nxt}")
    op = old_preds(f"{d}/{log}", rnd)
    for name, (model, b, prec, sms) in nw.items():
        if name not in pw or name not in op:
            continue
        a_prev = alone(f"{d}/profiles", model, b, prec, pw[name][3])
        a_next = alone(f"{d}/profiles", model, b, prec, sms)
        if not a_prev or not a_next:
            continue
        ratio = a_next * max(1.0, pm[name] / a_prev)
        delay = a_next + max(0.0, pm[name] - a_prev)
        meas = nm[name]
        olds.append(op[name] / meas - 1); ratios.append(ratio / meas - 1); delays.append(delay / meas - 1)
        print(f"| {prev} → {nxt} | {name} | {pw[name][3]} → {sms} | {meas:.3f} | {op[name]:.3f} | {op[name]/meas-1:+.0%} "
              f"| {ratio:.3f} | {ratio/meas-1:+.0%} | {delay:.3f} | {delay/meas-1:+.0%} |")
within = lambda e: sum(abs(x) <= 0.15 for x in e)
mean = lambda e: sum(map(abs, e)) / len(e)
print(f"\nwithin 15 %: as made {within(olds)}/{len(olds)}, ratio {within(ratios)}/{len(ratios)}, "
      f"delay {within(delays)}/{len(delays)}; mean |error| as made {mean(olds):.1%}, "
      f"ratio {mean(ratios):.1%}, delay {mean(delays):.1%}; worst |error| delay {max(map(abs, delays)):.0%}")
