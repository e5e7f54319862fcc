#!/usr/bin/env python3
"""The criticality comparison of issue 14 (docs/criticality.md), with isolane on one machine.

Two critical victims at a share of their alone-in-partition capacity, with a deadline of
`--slack` x their p99 alone, beside one best-effort model flat out, under each mechanism with
and without isolane's protection; then the trade-off curve (victim load) under protection.

    scripts/protection_study.py --out results/h100-protection              # the H100 study
    scripts/protection_study.py --backend cpu --out /tmp/p --duration 1    # spin stand-ins

Steps (every number is measured in this run, nothing is typed in):
  1. alone: each workload alone in its partition (green SMs; thread host), closed loop:
     capacity = its throughput, p99 = its p99 latency (= service time in closed loop);
  2. compare: victims at --load x capacity, deadline --slack x p99, the best-effort model flat
     out, for each mechanism, unprotected ([protection] enabled = false) and protected;
  3. tradeoff: the same with protection (and without) at each of --loads.
Writes <out>/protection.csv (one row per run and workload) and <out>/protection.md (tables).
Python >= 3.7, standard library only.
"""

import argparse
import csv
import json
import os
import subprocess
import sys

TOTAL_SMS = 132


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--isolane", default=None, help="the isolane binary (default: stage/isolane, "
                   "else target/release/isolane)")
    p.add_argument("--out", required=True)
    p.add_argument("--backend", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--precision", default="fp16")
    p.add_argument("--victims", default="vit_b_16:48,resnet18:32",
                   help="critical models and their green SMs, model:sms,...")
    p.add_argument("--best-effort", default="vit_l_32:48", help="model:sms")
    p.add_argument("--load", type=float, default=0.75)
    p.add_argument("--slack", type=float, default=1.3)
    p.add_argument("--loads", default="0.5,0.6,0.7,0.8,0.9")
    p.add_argument("--mechanisms", default="green,mps,timeslice")
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--piece-us", type=int, default=250)
    p.add_argument("--margin-us", type=int, default=100)
    p.add_argument("--stretch", type=float, default=None,
                   help="[protection] stretch of the protected runs, e.g. the worst p99 stretch "
                        "of `isolane interference` (default: unset, the stall model)")
    return p.parse_args()


def binary(args):
    for b in [args.isolane, "stage/isolane", "target/release/isolane"]:
        if b and os.path.exists(b):
            return os.path.abspath(b)
    sys.exit("no isolane binary: pass --isolane")


def split(spec):
    model, _, sms = spec.partition(":")
    return model, int(sms or 0)


def cpu_stand_in(model):
    """On the CPU, a spin model stands in for each network (distinct service times)."""
    return {"vit_b_16": "spin:1ms", "resnet18": "spin:0.5ms", "vit_l_32": "spin:3ms"}.get(
        model, model)


def workload_toml(args, w):
    """One [[workload]] table. w: name, model, sms, rate (None: max), deadline_ms, criticality,
    mechanism."""
    model = w["model"] if args.backend == "cuda" else cpu_stand_in(w["model"])
    lines = ["[[workload]]", f'name = "{w["name"]}"', f'model = "{model}"']
    if args.backend == "cuda":
        lines.append(f'precision = "{args.precision}"')
    lines.append(f'rate_hz = {w["rate"]:.3f}' if w.get("rate") else 'rate_hz = "max"')
    if w.get("deadline_ms"):
        lines.append(f'deadline_ms = {w["deadline_ms"]:.4f}')
    lines.append(f"duration_s = {args.duration}")
    lines.append("warmup_jobs = 50")
    lines.append(f'criticality = "{w.get("criticality", "critical")}"')
    mech = w["mechanism"]
    if args.backend == "cuda" and mech == "green":
        lines.append(f'partition = {{ sms = {w["sms"]} }}')
    elif args.backend == "cuda" and mech == "mps":
        lines.append(f'partition = {{ thread_pct = {max(1, round(100 * w["sms"] / TOTAL_SMS))} }}')
    return "\n".join(lines)


def scenario_toml(args, mechanism, workloads, protected):
    if args.backend == "cuda":
        host = "thread" if mechanism == "green" else "process"
        device = (f'[device]\nbackend = "cuda"\nmechanism = "{mechanism}"\nhost = "{host}"\n')
    else:
        device = '[device]\nbackend = "cpu"\nhost = "thread"\n'
    prot = (f"[protection]\nenabled = {'true' if protected else 'false'}\n"
            f"piece_us = {args.piece_us}\nmargin_us = {args.margin_us}\n")
    if args.stretch:
        prot += f"stretch = {args.stretch}\n"
    body = "\n\n".join(workload_toml(args, dict(w, mechanism=mechanism)) for w in workloads)
    return f"{device}\n{prot}\n{body}\n"


def run(args, exe, folder, text):
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "scenario-in.toml")
    with open(path, "w") as f:
        f.write(text)
    out = os.path.join(folder, "run")
    cmd = [exe, "run", "-q", "--force", "--out", out, path]
    print("$", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with open(os.path.join(folder, "log.txt"), "w") as f:
        f.write(r.stdout)
    if r.returncode != 0:
        print(r.stdout[-3000:])
        raise SystemExit(f"run failed ({r.returncode}): {folder}")
    with open(os.path.join(out, "summary.json")) as f:
        return {w["name"]: w for w in json.load(f)["workloads"]}


def main():
    args = parse_args()
    exe = binary(args)
    os.makedirs(args.out, exist_ok=True)
    victims = [split(v) for v in args.victims.split(",")]
    be_model, be_sms = split(args.best_effort)
    everyone = [(f"v{i}_{m}", m, s) for i, (m, s) in enumerate(victims)] + [
        (f"be_{be_model}", be_model, be_sms)]

    alone = {}
    for name, model, sms in everyone:
        w = dict(name=name, model=model, sms=sms)
        s = run(args, exe, os.path.join(args.out, "alone", name),
                scenario_toml(args, "green", [w], False))[name]
        alone[name] = dict(capacity=s["throughput_ips"], p99=s["latency_ms"]["p99"])
    with open(os.path.join(args.out, "alone.json"), "w") as f:
        json.dump(alone, f, indent=1)

    def workloads(load):
        ws = []
        for name, model, sms in everyone[:-1]:
            a = alone[name]
            ws.append(dict(name=name, model=model, sms=sms, rate=load * a["capacity"],
                           deadline_ms=args.slack * a["p99"]))
        name, model, sms = everyone[-1]
        ws.append(dict(name=name, model=model, sms=sms, criticality="best_effort"))
        return ws

    rows = []

    def record(study, mechanism, protected, load, summary):
        for name, w in summary.items():
            be = name == everyone[-1][0]
            held = w.get("held") or {}
            rows.append(dict(
                study=study, mechanism=mechanism, protected=int(protected), load=load,
                workload=name, criticality=w.get("criticality", ""),
                jobs=w["jobs"], timeout_pct=w["timeout_pct"],
                p50_ms=w["latency_ms"]["p50"], p99_ms=w["latency_ms"]["p99"],
                max_ms=w["latency_ms"]["max"], throughput_ips=w["throughput_ips"],
                of_alone=w["throughput_ips"] / alone[name]["capacity"] if be else "",
                held_ms=held.get("total_ms", 0), pieces=held.get("pieces", "")))

    for mechanism in args.mechanisms.split(","):
        if args.backend == "cpu" and mechanism != "green":
            continue
        for protected in (False, True):
            tag = f"{mechanism}-{'protected' if protected else 'unprotected'}"
            s = run(args, exe, os.path.join(args.out, "compare", tag),
                    scenario_toml(args, mechanism, workloads(args.load), protected))
            record("compare", mechanism, protected, args.load, s)
    for load in [float(x) for x in args.loads.split(",") if x]:
        for protected in (False, True):
            tag = f"load{round(load * 100)}-{'protected' if protected else 'unprotected'}"
            s = run(args, exe, os.path.join(args.out, "tradeoff", tag),
                    scenario_toml(args, "green", workloads(load), protected))
            record("tradeoff", "green", protected, load, s)

    with open(os.path.join(args.out, "protection.csv"), "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        wr.writeheader()
        wr.writerows(rows)
    write_markdown(args, alone, rows, everyone)
    print(open(os.path.join(args.out, "protection.md")).read())


def write_markdown(args, alone, rows, everyone):
    be = everyone[-1][0]
    out = [f"# Criticality protection ({args.backend}, {args.precision})", "",
           f"Victims at {args.load:.0%} of their alone capacity, deadline {args.slack} x p99 alone; "
           f"best effort `{be}` flat out; pieces of {args.piece_us} µs, margin {args.margin_us} µs, "
           f"stretch {args.stretch or 'unset (stall model)'}; "
           f"{args.duration} s per run.", "", "| workload | alone capacity /s | alone p99 ms |",
           "| --- | --- | --- |"]
    out += [f"| {n} | {a['capacity']:.1f} | {a['p99']:.3f} |" for n, a in alone.items()]
    for study in ("compare", "tradeoff"):
        out += ["", f"## {study}", "",
                "| mechanism | protected | load | victim timeouts % (each) | victim max ms (each) "
                "| best effort /s | of alone | held s |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        keys = []
        for r in rows:
            k = (r["mechanism"], r["protected"], r["load"])
            if r["study"] == study and k not in keys:
                keys.append(k)
        for k in keys:
            rs = [r for r in rows if r["study"] == study and (r["mechanism"], r["protected"], r["load"]) == k]
            v = [r for r in rs if r["workload"] != be]
            b = [r for r in rs if r["workload"] == be][0]
            out.append(
                f"| {k[0]} | {'yes' if k[1] else 'no'} | {k[2]:.2f} | "
                + " / ".join(f"{r['timeout_pct']:.2f}" for r in v) + " | "
                + " / ".join(f"{r['max_ms']:.2f}" for r in v) + " | "
                + f"{b['throughput_ips']:.1f} | {b['of_alone']:.0%} | {b['held_ms'] / 1e3:.2f} |")
    with open(os.path.join(args.out, "protection.md"), "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
