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
    p.add_argument("--piece-us", type=int, default=100)
    p.add_argument("--margin-us", type=int, default=20)
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


UNPROTECTED = False


def scenario_toml(args, mechanism, workloads, stretch):
    """stretch: False (the string-free sentinel UNPROTECTED) for [protection] enabled = false,
    None for protection with the stall model, a number for protection with that stretch."""
    if args.backend == "cuda":
        host = "thread" if mechanism == "green" else "process"
        device = (f'[device]\nbackend = "cuda"\nmechanism = "{mechanism}"\nhost = "{host}"\n')
    else:
        device = '[device]\nbackend = "cpu"\nhost = "thread"\n'
    protected = stretch is not UNPROTECTED
    prot = (f"[protection]\nenabled = {'true' if protected else 'false'}\n"
            f"piece_us = {args.piece_us}\nmargin_us = {args.margin_us}\n")
    if protected and stretch:
        prot += f"stretch = {stretch:.3f}\n"
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


def exec_ms(run_dir, workload):
    """Execution times (end - start, ms) of a run's completed jobs, sorted."""
    with open(os.path.join(run_dir, "jobs", workload + ".csv")) as f:
        return sorted(float(r["end_ms"]) - float(r["start_ms"])
                      for r in csv.DictReader(f) if r["end_ms"])


def pct(v, q):
    return v[min(len(v) - 1, int(len(v) * q))] if v else float("nan")


def main():
    args = parse_args()
    exe = binary(args)
    os.makedirs(args.out, exist_ok=True)
    victims = [split(v) for v in args.victims.split(",")]
    be_model, be_sms = split(args.best_effort)
    everyone = [(f"v{i}_{m}", m, s) for i, (m, s) in enumerate(victims)] + [
        (f"be_{be_model}", be_model, be_sms)]
    mechanisms = [m for m in args.mechanisms.split(",")
                  if args.backend == "cuda" or m == "green"]

    # 1. Each workload alone in its partition, per mechanism: capacity, p99, p99 execution.
    alone = {}
    for mech in mechanisms:
        alone[mech] = {}
        for name, model, sms in everyone:
            folder = os.path.join(args.out, "alone", mech, name)
            s = run(args, exe, folder, scenario_toml(
                args, mech, [dict(name=name, model=model, sms=sms)], UNPROTECTED))[name]
            alone[mech][name] = dict(capacity=s["throughput_ips"], p99=s["latency_ms"]["p99"],
                                     exec_p99=pct(exec_ms(os.path.join(folder, "run"), name), .99))
    with open(os.path.join(args.out, "alone.json"), "w") as f:
        json.dump(alone, f, indent=1)

    def workloads(mech, load):
        ws = []
        for name, model, sms in everyone[:-1]:
            a = alone[mech][name]
            ws.append(dict(name=name, model=model, sms=sms, rate=load * a["capacity"],
                           deadline_ms=args.slack * a["p99"]))
        name, model, sms = everyone[-1]
        ws.append(dict(name=name, model=model, sms=sms, criticality="best_effort"))
        return ws

    rows = []

    def record(study, mech, protection, load, folder, summary):
        for name, w in summary.items():
            be = name == everyone[-1][0]
            held = w.get("held") or {}
            ex = exec_ms(os.path.join(folder, "run"), name)
            rows.append(dict(
                study=study, mechanism=mech, protection=protection, load=load,
                workload=name, criticality=w.get("criticality", ""),
                jobs=w["jobs"], timeout_pct=w["timeout_pct"],
                p50_ms=w["latency_ms"]["p50"], p99_ms=w["latency_ms"]["p99"],
                max_ms=w["latency_ms"]["max"], exec_p99_ms=pct(ex, .99),
                exec_stretch=pct(ex, .99) / alone[mech][name]["exec_p99"],
                throughput_ips=w["throughput_ips"],
                of_alone=w["throughput_ips"] / alone[mech][name]["capacity"] if be else "",
                held_ms=held.get("total_ms", 0), pieces=held.get("pieces", "")))

    def measure(study, mech, load):
        """Unprotected, then protected with the stall model, then with the victims' worst p99
        execution stretch measured in the unprotected run."""
        tag = f"{study}/{mech}-load{round(load * 100)}"
        folder = os.path.join(args.out, tag + "-unprotected")
        s = run(args, exe, folder, scenario_toml(args, mech, workloads(mech, load), UNPROTECTED))
        record(study, mech, "none", load, folder, s)
        stretch = max(r["exec_stretch"] for r in rows[-len(s):] if r["criticality"] == "critical")
        for label, st in (("stall", None), (f"stretch {stretch:.2f}", stretch)):
            if st is not None and st <= 1.0:
                continue
            folder = os.path.join(args.out, tag + ("-stall" if st is None else "-stretch"))
            s = run(args, exe, folder, scenario_toml(args, mech, workloads(mech, load), st))
            record(study, mech, label, load, folder, s)

    for mech in mechanisms:
        measure("compare", mech, args.load)
    for load in [float(x) for x in args.loads.split(",") if x]:
        measure("tradeoff", "green", load)

    with open(os.path.join(args.out, "protection.csv"), "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        wr.writeheader()
        wr.writerows(rows)
    write_markdown(args, alone, rows, everyone)
    print(open(os.path.join(args.out, "protection.md")).read())


def write_markdown(args, alone, rows, everyone):
    be = everyone[-1][0]
    out = [f"# Criticality protection ({args.backend}, {args.precision})", "",
           f"Critical victims at {args.load:.0%} of their alone-in-partition capacity (trade-off: "
           f"other loads), deadline {args.slack} x their p99 alone; best effort `{be}` flat out; "
           f"pieces of {args.piece_us} µs, margin {args.margin_us} µs; {args.duration} s per run. "
           "Protection `stall`: the full-stall model; `stretch s`: the victims' worst p99 "
           "execution stretch measured in the unprotected run just before.", "",
           "| mechanism | workload | alone capacity /s | alone p99 ms | alone exec p99 ms |",
           "| --- | --- | --- | --- | --- |"]
    for mech, ws in alone.items():
        out += [f"| {mech} | {n} | {a['capacity']:.1f} | {a['p99']:.3f} | {a['exec_p99']:.3f} |"
                for n, a in ws.items()]
    for study in ("compare", "tradeoff"):
        out += ["", f"## {study}", "",
                "| mechanism | load | protection | victim timeouts % | victim max ms "
                "| victim exec stretch p99 | best effort /s | of alone | held s |",
                "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        keys = []
        for r in rows:
            k = (r["mechanism"], r["load"], r["protection"])
            if r["study"] == study and k not in keys:
                keys.append(k)
        for k in keys:
            rs = [r for r in rows if r["study"] == study
                  and (r["mechanism"], r["load"], r["protection"]) == k]
            v = [r for r in rs if r["workload"] != be]
            b = [r for r in rs if r["workload"] == be][0]
            each = lambda key, fmt: " / ".join(fmt.format(r[key]) for r in v)
            out.append(
                f"| {k[0]} | {k[1]:.2f} | {k[2]} | {each('timeout_pct', '{:.2f}')} | "
                f"{each('max_ms', '{:.2f}')} | {each('exec_stretch', '{:.2f}')} | "
                f"{b['throughput_ips']:.1f} | {b['of_alone']:.0%} | {b['held_ms'] / 1e3:.2f} |")
    with open(os.path.join(args.out, "protection.md"), "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
