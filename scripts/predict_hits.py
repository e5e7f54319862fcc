#!/usr/bin/env python3
"""The first plan's hit rate (issue 34, "Measure") from the folders scripts/predict-h200.sh
`plans` leaves: RESULTS/plans/<way>/<scenario>/ for way `predict` (the stretch predicted from
the memory system, docs/planner.md "Predicted stretch") and `nopredict` (`--no-predict`), each
with verdict.txt (what `plan --auto --verify --rounds 1` ended with), planned.toml (its first
plan, whose `# planned:` comments give each workload's partition and predicted p99) and
verify/summary.json (what round 1 measured).

    python3 scripts/predict_hits.py results/h200-predict [--left "a.toml b.toml"]

A first plan *holds* when `plan --auto` says so (every workload, best effort too, at most
0.1 % timeouts and its p99 within its deadline: the planner's own verdict); the critical
column counts only the critical workloads, which is what the prediction is for. A way whose
plan is the same as the other way's (the same partitions) was verified once, and the verdict
is counted for both. Writes the table on stdout; exit 1 when no verdict was found.
"""
import argparse
import json
import os
import re
import sys

WAYS = ("predict", "nopredict")


def planned(path):
    """Each workload's partition and predicted p99 from a planned file's comments, in order."""
    out, pending = [], None
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return out
    for line in lines:
        m = re.match(r"# planned: ([^;]+); predicted p99 ([0-9.]+) ms", line)
        if m:
            pending = (m.group(1), float(m.group(2)))
            continue
        m = re.match(r'name = "([^"]+)"', line)
        if m and pending:
            out.append((m.group(1), pending[0], pending[1]))
            pending = None
    return out


def measured(path):
    """Each workload's criticality, timeouts (%), p99 and deadline from a run's summary.json."""
    try:
        s = json.load(open(path))
    except (OSError, ValueError):
        return {}
    out = {}
    for w in s.get("workloads", []):
        p99 = (w.get("latency_ms") or {}).get("p99")
        out[w["name"]] = (w.get("criticality", "critical"), w.get("timeout_pct"), p99,
                          w.get("deadline_ms"))
    return out


def missed(timeout_pct, p99, deadline):
    """The planner's rule (isolane_planner auto::rounds::missed)."""
    if timeout_pct is None or p99 is None:
        return True
    return timeout_pct > 0.1 or (deadline is not None and p99 > deadline)


def one(results, way, name):
    d = os.path.join(results, "plans", way, name)
    try:
        verdict = open(os.path.join(d, "verdict.txt")).read().strip()
    except OSError:
        return None
    plan = planned(os.path.join(d, "planned.toml"))
    # A way verified once for both (the same plan) points at the other way's run.
    run = d
    m = re.search(r"same plan as (\w+)", verdict)
    if m:
        run = os.path.join(results, "plans", m.group(1), name)
    # Only a verification that ran to its end has a verdict on the critical deadlines.
    verified = re.match(r"(holds|misses)\b", verdict) is not None
    runs = measured(os.path.join(run, "verify", "summary.json")) if verified else {}
    crit = [n for n, (c, *_r) in runs.items() if c == "critical"]
    crit_missed = [n for n in crit if missed(*runs[n][1:])]
    worst = None
    for n, part, pred in plan:
        r = runs.get(n)
        if r and r[2]:
            err = pred / r[2] - 1.0
            if worst is None or abs(err) > abs(worst[1]):
                worst = (n, err)
    return {
        "verdict": verdict,
        "holds": verdict.startswith("holds"),
        "plan": ", ".join(f"{n} {p}" for n, p, _ in plan) or "none",
        "critical": None if not runs else (len(crit) - len(crit_missed), len(crit)),
        "critical_missed": crit_missed,
        "worst": worst,
        "late": ", ".join(f"{n} {runs[n][1]:.2f} %" for n in runs
                          if runs[n][1] is not None and runs[n][1] > 0.1),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results")
    ap.add_argument("--left", default="", help="scenarios not started (the time budget)")
    ap.add_argument("--verify-s", default="?", help="each verification's length (s)")
    a = ap.parse_args()
    names = set()
    for way in WAYS:
        d = os.path.join(a.results, "plans", way)
        if os.path.isdir(d):
            names.update(os.listdir(d))
    rows = {n: {w: one(a.results, w, n) for w in WAYS} for n in sorted(names)}
    rows = {n: r for n, r in rows.items() if any(r.values())}
    print(f"# First plan's hit rate (plan --auto --verify --rounds 1, {a.verify_s} s a "
          "verification)\n")
    print("| scenario | way | first plan | verdict | critical held | late (> 0.1 %) | "
          "worst predicted p99 |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for n, r in rows.items():
        for w in WAYS:
            x = r[w]
            if x is None:
                print(f"| {n} | {w} | | not run | | | |")
                continue
            crit = "" if x["critical"] is None else "%d of %d" % x["critical"]
            worst = "" if x["worst"] is None else "%s %+.0f %%" % (x["worst"][0],
                                                                   100 * x["worst"][1])
            print(f"| {n} | {w} | {x['plan']} | {x['verdict']} | {crit} | {x['late']} | "
                  f"{worst} |")
    print()
    for w in WAYS:
        xs = [r[w] for r in rows.values() if r[w] is not None]
        held = sum(x["holds"] for x in xs)
        ran = [x for x in xs if x["critical"] is not None]
        crit = sum(not x["critical_missed"] for x in ran)
        print(f"- {w}: {held} of {len(xs)} first plans hold (the planner's verdict); the "
              f"critical deadlines held in {crit} of the {len(ran)} verified")
    if a.left.strip():
        print(f"\nNot started (time budget): {a.left.strip()}")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
