#!/usr/bin/env python3
# Usage: python3 scripts/planner_p99_retro.py [--tail]
# Retro-computation on the committed H100 verification runs (results/h100-planner/session12*/
# and session15/*/): each run's p99 predicted from the previous run of the same workloads, three
# ways: as made at the time (session 12's runs only: the p99 alone × the p99.9's stretch),
# session 14's rule (× the previous run's p99 over its p99 alone, never below 1) and session
# 15's (+ the previous run's p99 minus its p99 alone, never below 0: the delay the neighbours
# add). --tail does the same for the p99.9 (ratio against delay), which sizes the partitions.
# Profiles: the same folder's profiles/ (the p99 and p99.9 alone per size).
import glob, json, os, re, sys, tomllib
base = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "results", "h100-planner")
TAIL = "--tail" in sys.argv[1:]
STAT = "p999" if TAIL else "p99"

def load(run_dir):
    sc = tomllib.load(open(f"{run_dir}/scenario.toml", "rb"))
    sm = json.load(open(f"{run_dir}/summary.json"))
    meas = {w["name"]: w["latency_ms"][STAT] for w in sm["workloads"]}
    ws = {w["name"]: (w["model"], w.get("batch", 1), w["precision"], w["partition"]["sms"])
          for w in sc["workload"]}
    return ws, meas

def alone(prof_dir, model, batch, prec, sms):
    f = glob.glob(f"{prof_dir}/*/*/{model}-b{batch}-{prec}-green-{sms}.json")
    if not f:
        return None
    d = json.load(open(f[0]))
    return (d.get("exec_p999_ms") or d["exec_p99_ms"]) if TAIL else d["exec_p99_ms"]

def old_preds(logfile, round_no):
    # the "p99 pred" column of verification run `round_no` in plan-*.txt
    txt = open(logfile).read()
    parts = re.split(r"verification run (\d+):", txt)
    for i in range(1, len(parts), 2):
        if int(parts[i]) == round_no:
            rows = re.findall(r"^(\S+)\s+([\d.]+)\s+([\d.]+)\s", parts[i + 1], re.M)
            return {r[0]: float(r[1]) for r in rows if r[0] != "workload"}
    return {}

# (folder, previous run, next run, session 12's log of the next run and its round number)
pairs = [
    ("session12", "verify-inspection-line.2", "verify-inspection-line.2.round2", "plan-inspection-line.2.txt", 2),
    ("session12", "verify-inspection-line.2.round2", "verify-inspection-line.2.round3", "plan-inspection-line.2.txt", 3),
    ("session12", "verify-three-cameras", "verify-three-cameras.2", "plan-three-cameras.2.txt", 1),
    ("session12", "verify-inspection-line", "verify-inspection-line.2", "plan-inspection-line.2.txt", 1),
    ("session12b", "verify-batch-inspection", "verify-batch-inspection.round2", "plan-batch-inspection.txt", 2),
    ("session12b", "verify-batch-inspection.round2", "verify-batch-inspection.2", "plan-batch-inspection.2.txt", 1),
]
if "--session12" not in sys.argv[1:]:
    for folder, scenario, runs in [
        ("session15/a", "three-cameras", ["", ".round2", ".2"]),
        ("session15/a", "inspection-line", ["", ".round2", ".2"]),
        ("session15/b", "batch-inspection", ["", ".round2", ".2"]),
        ("session15/b", "heavy-inspection", ["", ".round2", ".round3", ".2"]),
        ("session15/c", "batch-inspection", ["", ".round2"]),
        ("session15/c", "heavy-inspection", ["", ".round2", ".2"]),
        ("session15/d", "batch-inspection", ["", ".round2"]),
    ]:
        for prev, nxt in zip(runs, runs[1:]):
            pairs.append((folder, f"verify-{scenario}{prev}", f"verify-{scenario}{nxt}", None, None))

print(f"{STAT} | runs | workload | SMs before → after | measured | as made | error | ratio | error | delay | error |")
print("| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
olds, ratios, delays = [], [], []
for sess, prev, nxt, log, rnd in pairs:
    d = f"{base}/{sess}"
    if not (os.path.exists(f"{d}/{prev}") and os.path.exists(f"{d}/{nxt}")):
        continue
    pw, pm = load(f"{d}/{prev}")
    nw, nm = load(f"{d}/{nxt}")
    op = old_preds(f"{d}/{log}", rnd) if log and not TAIL else {}
    for name, (model, b, prec, sms) in nw.items():
        if name not in pw:
            continue
        a_prev = alone(f"{d}/profiles", model, b, prec, pw[name][3])
        a_next = alone(f"{d}/profiles", model, b, prec, sms)
        if not a_prev or not a_next:
            continue
        ratio = a_next * max(1.0, pm[name] / a_prev)
        delay = a_next + max(0.0, pm[name] - a_prev)
        meas = nm[name]
        ratios.append(ratio / meas - 1)
        delays.append(delay / meas - 1)
        made = "| — | — "
        if name in op:
            olds.append(op[name] / meas - 1)
            made = f"| {op[name]:.3f} | {op[name] / meas - 1:+.0%} "
        print(f"| {sess}: {prev} → {nxt} | {name} | {pw[name][3]} → {sms} | {meas:.3f} {made}"
              f"| {ratio:.3f} | {ratio / meas - 1:+.0%} | {delay:.3f} | {delay / meas - 1:+.0%} |")

within = lambda e: sum(abs(x) <= 0.15 for x in e)
mean = lambda e: sum(map(abs, e)) / len(e) if e else float("nan")
made = f"as made {within(olds)}/{len(olds)} ({mean(olds):.1%}), " if olds else ""
print(f"\n{STAT} within 15 % (mean |error|): {made}ratio {within(ratios)}/{len(ratios)} ({mean(ratios):.1%}), "
      f"delay {within(delays)}/{len(delays)} ({mean(delays):.1%}); under-predicted by more than 15 %: "
      f"ratio {sum(x < -0.15 for x in ratios)}, delay {sum(x < -0.15 for x in delays)}")
