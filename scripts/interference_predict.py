#!/usr/bin/env python3
"""Predicted against measured stretch for every pair cell of an interference matrix
(`isolane interference`'s interference.json), with the stretch model of isolane_core::predict
(docs/interference.md, "Predicting the stretch"): its coefficients and memory systems are read
from crates/isolane-core/src/predict/mod.rs, each model's profile from the engine's
crates/isolane-core/src/predict/h200-models.csv (fp16, batch 1, the H200's L2).

    python3 scripts/interference_predict.py results/h200-interference/green-fp16 [--device h200]

For each pair cell: the victim's p99 execution time alone (its alone cell's exec_ms.p99), the
neighbour's time per job alone (1000 / neighbour_jobs_per_s of its neighbour cell, which
`--neighbour-alone` measures; closed loop, so it is its execution time), both models' profiles,
and the measured stretch_p99. Cells with a model the CSV lacks (kernel: models, other
precisions or batches) are listed as not predicted. Prints a Markdown table and the mean and
worst |error|; exit 1 when no cell could be predicted.
"""
import argparse
import csv
import json
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
PREDICT = os.path.join(ROOT, "crates/isolane-core/src/predict")


def rust_constants(device):
    src = open(os.path.join(PREDICT, "mod.rs")).read()
    m = re.search(r'"%s" => Some\(MemorySystem \{\s*dram_bytes_per_s: ([0-9.e_]+),\s*l2_bytes: ([0-9_]+),' % re.escape(device), src)
    if not m:
        sys.exit("no memory system for %s in predict/mod.rs" % device)
    dram_peak, l2 = float(m.group(1).replace("_", "")), float(m.group(2).replace("_", ""))
    c = re.search(r'device_model: "%s",\s*coefficients: Coefficients \{\s*dram: ([0-9.]+),\s*l2: ([0-9.]+),' % re.escape(device), src)
    if not c:
        sys.exit("no fitted coefficients for %s in predict/mod.rs" % device)
    return dram_peak, l2, float(c.group(1)), float(c.group(2))


def profiles():
    out = {}
    for r in csv.DictReader(open(os.path.join(PREDICT, "h200-models.csv"))):
        out[(r["model"], r["precision"], int(r["batch"]))] = r
    return out


def terms(victim_ms, neighbour, neighbour_ms, dram_peak, l2):
    dram_bytes = float(neighbour["dram_bytes"])
    dram = dram_bytes / (neighbour_ms * 1e-3) / dram_peak
    if neighbour["resident"] == "true":
        share = float(neighbour["l2_footprint_bytes"]) / l2
    else:
        share = dram_bytes * (victim_ms / neighbour_ms) / l2
    return dram, min(max(share, 0.0), 1.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("matrix", help="interference.json or its folder")
    ap.add_argument("--device", default="h200")
    a = ap.parse_args()
    path = a.matrix if a.matrix.endswith(".json") else os.path.join(a.matrix, "interference.json")
    m = json.load(open(path))
    dram_peak, l2, ca, cb = rust_constants(a.device)
    prof = profiles()
    alone = {}
    nb_ms = {}
    for c in m["cells"]:
        if c.get("status") != "ok":
            continue
        if c["kind"] == "alone" and c["exec_ms"].get("p99"):
            alone[(c["victim"], c["precision"])] = c["exec_ms"]["p99"]
        if c["kind"] == "neighbour" and c.get("neighbour_jobs_per_s"):
            nb_ms[(c["neighbour"], c.get("neighbour_size"), c["precision"])] = 1000.0 / c["neighbour_jobs_per_s"]
    print("| victim | neighbour | size | measured ×p99 | predicted | error |")
    print("| --- | --- | --- | --- | --- | --- |")
    errs, skipped = [], []
    for c in m["cells"]:
        if c["kind"] != "pair" or c.get("status") != "ok" or not c.get("stretch_p99"):
            continue
        v, n, size, prec = c["victim"], c["neighbour"], c.get("neighbour_size"), c["precision"]
        np_ = prof.get((n, prec, 1))
        t_v = alone.get((v, prec))
        t_n = nb_ms.get((n, size, prec))
        if not (prof.get((v, prec, 1)) and np_ and t_v and t_n):
            skipped.append("%s beside %s @%s" % (v, n, size))
            continue
        d, s = terms(t_v, np_, t_n, dram_peak, l2)
        pred = 1.0 + ca * d + cb * s
        err = pred / c["stretch_p99"] - 1.0
        errs.append(err)
        print("| %s | %s | %s | %.2f | %.2f | %+.1f %% |" % (v, n, size, c["stretch_p99"], pred, 100 * err))
    if skipped:
        print("\nnot predicted (no profile, or no alone/neighbour cell): " + ", ".join(skipped))
    if not errs:
        print("no cell could be predicted", file=sys.stderr)
        return 1
    print("\n%d pairs: mean |error| %.1f %%, worst %.1f %%; within 15 %%: %d" % (
        len(errs), 100 * sum(abs(e) for e in errs) / len(errs), 100 * max(abs(e) for e in errs),
        sum(abs(e) <= 0.15 for e in errs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
