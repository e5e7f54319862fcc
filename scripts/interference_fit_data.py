#!/usr/bin/env python3
"""Extracts the H200 interference points the stretch prediction is fitted to
(isolane_core::predict, docs/interference.md "Predicting the stretch") from the committed
criticality-protection studies, results/h200-protection/**/protection.csv.

Each study ran two critical victims (vit_b_16 in 48 SMs, resnet18 in 32) at a load of their
alone capacity and a best-effort vit_l_32 flat out in 48 SMs, fp16, in green contexts or MPS.
A point is one victim's p99 execution time beside its neighbours over its p99 execution time
alone at the same rate in the same study (`only-<victim>`): `victims-only` (beside the other
victim) and `none` (beside both, unprotected). Repeats and studies of one (mechanism, load,
variant, victim) are summarised by their median. Time-slicing is left out: its victims wait
for each other's jobs, which is not the memory system's interference.

Neighbour execution times: a victim's own p99 at its rate in the same study; the best-effort
model's p99 alone closed loop in its partition (the study's alone.json).

    python3 scripts/interference_fit_data.py > crates/isolane-core/src/predict/h200-points.csv
"""
import csv
import glob
import json
import os
import statistics
import sys
from collections import defaultdict

ROOT = os.path.join(os.path.dirname(__file__), "..")


def main():
    files = sorted(glob.glob(os.path.join(ROOT, "results/h200-protection/**/protection.csv"), recursive=True))
    points = defaultdict(list)
    for f in files:
        study = os.path.dirname(f)
        rows = list(csv.DictReader(open(f)))
        alone_file = os.path.join(study, "alone.json")
        if not os.path.exists(alone_file):
            alone_file = os.path.join(os.path.dirname(study), "alone.json")
        alone = json.load(open(alone_file)) if os.path.exists(alone_file) else {}
        ref = defaultdict(list)
        for r in rows:
            if r["variant"].startswith("only-") and r["exec_p99_ms"]:
                ref[(r["mechanism"], r["load"], r["workload"])].append(float(r["exec_p99_ms"]))
        for r in rows:
            if r["mechanism"] == "timeslice" or r["variant"] not in ("victims-only", "none"):
                continue
            if r["criticality"] != "critical" or not r["exec_p99_ms"]:
                continue
            key = (r["mechanism"], r["load"], r["workload"])
            if key not in ref:
                continue
            neighbours = []
            for o in rows:
                if o["mechanism"] != r["mechanism"] or o["load"] != r["load"]:
                    continue
                if o["variant"] != r["variant"] or o["repeat"] != r["repeat"] or o["workload"] == r["workload"]:
                    continue
                if o["criticality"] == "critical":
                    own = ref.get((o["mechanism"], o["load"], o["workload"]))
                    if not own:
                        break
                    exec_ms = statistics.mean(own)
                else:
                    a = alone.get(o["mechanism"], {}).get(o["workload"])
                    if not a:
                        break
                    exec_ms = a["exec_p99"]
                neighbours.append((o["workload"].split("_", 1)[1], exec_ms))
            else:
                points[(r["mechanism"], r["load"], r["variant"], r["workload"])].append(
                    (
                        statistics.mean(ref[key]),
                        float(r["exec_p99_ms"]) / statistics.mean(ref[key]),
                        tuple(sorted(neighbours)),
                        os.path.relpath(study, ROOT),
                    )
                )
    w = csv.writer(sys.stdout, lineterminator="\n")
    w.writerow(["mechanism", "load", "variant", "victim", "victim_exec_ms", "neighbours", "stretch_p99", "runs", "studies"])
    for (mech, load, variant, workload), v in sorted(points.items()):
        model = workload.split("_", 1)[1]
        names = sorted({n for _, _, ns, _ in v for n, _ in ns})
        nb = ";".join(
            "%s:%.4f" % (n, statistics.median([e for _, _, ns, _ in v for m, e in ns if m == n])) for n in names
        )
        w.writerow([
            mech, load, variant, model,
            "%.4f" % statistics.median([x[0] for x in v]),
            nb,
            "%.4f" % statistics.median([x[1] for x in v]),
            len(v),
            " ".join(sorted({x[3] for x in v})),
        ])


if __name__ == "__main__":
    main()
