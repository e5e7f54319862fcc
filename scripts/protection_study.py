#!/usr/bin/env python3
"""The criticality comparison of issue 14 (docs/criticality.md), with isolane on one machine.

Two critical victims at a share of their alone-in-partition capacity, with a deadline of
`--slack` x their p99 alone (or, `--deadline-base together`, x their p99 in the victims-only
baseline: both victims at that load, no best effort), beside one best-effort model flat out, under each mechanism with
each of isolane's protection levers, repeated; then the trade-off curve (victim load).

    scripts/protection_study.py --out results/h100-protection              # the H100 study
    scripts/protection_study.py --backend cpu --out /tmp/p --duration 1    # spin stand-ins

Steps (every number is measured in this run, nothing is typed in):
  1. alone: each workload alone in its partition, closed loop: capacity = its throughput,
     p99 = its p99 latency (= service time in closed loop), execution p99;
  2. compare: per mechanism, first the baselines without best effort (each victim alone at its
     rate; both victims together), then the victims at --load x capacity, deadline --slack x
     p99, beside the best-effort model flat out, under each of --variants:
       none      [protection] enabled = false
       pri       priorities only (critical streams first, best-effort MPS clients below normal)
       guard     the guard only (full-stall model), no priorities
       both      guard and priorities (isolane's default protection)
       stretch   guard with each victim's own stretch by best effort (its workload's
                 `stretch` key), and priorities: its p99 execution time in the first `none`
                 run over that in the victims-only baseline (what best effort adds to what
                 the critical set does to itself, which the guard's service estimate has)
     each --repeats times (a short-kernel model's stretch is fixed per run: interference.md),
     the victims-only baseline too (on the H200 it moved from 2.44 to 0.02 % between two
     calls); repeat by repeat, so that a study cut short by --budget-s still has every row;
     `VARIANT@N` runs VARIANT with best-effort pieces of N µs (piece_us) instead of
     --piece-us, e.g. share@25: pieces short enough to fit the gaps between critical jobs;
     `VARIANT~N` runs it with best effort in runs of fine pieces of N µs
     (`[protection] fine_piece_us = N`), each run at most the piece length, e.g. both~25;
     --deadline-base both runs the variants under each deadline (alone, then together);
  3. tradeoff: --tradeoff-variants at each of --loads, under --tradeoff-mechanism.
Every victim miss is attributed: `queued` (its job started later than the deadline allowed for
its execution: an earlier job overran) or `slow` (its own execution took too long), and for a
slow one whether the other victim was running meanwhile.
Writes <out>/protection.csv (one row per run and workload), <out>/misses.csv and
<out>/protection.md (tables: the median and the spread, min-max, over repeats), rewritten after
every run.
Python >= 3.7, standard library only.
"""

import argparse
import bisect
import csv
import json
import os
import re
import statistics
import subprocess
import sys
import time

TOTAL_SMS = 132

VARIANTS = {
    # name: (enabled, guard, priorities, use the measured stretch)
    "none": (False, True, True, False),
    "pri": (True, False, True, False),
    "guard": (True, True, False, False),
    "both": (True, True, True, False),
    "stretch": (True, True, True, True),
    # issue 34's levers, each with the guard and priorities ("both"), then all together
    "slack": (True, True, True, False),
    "share": (True, True, True, False),
    "l2": (True, True, True, False),
    "levers": (True, True, True, False),
}

# [protection] keys each lever variant adds (docs/scenario.md); --l2-mib sets l2_persist_mib.
LEVER_KEYS = {
    "slack": ["slack_order = true"],
    "share": ["share = true"],
    "l2": ["l2_persist_mib = {l2}"],
    "levers": ["slack_order = true", "share = true", "l2_persist_mib = {l2}"],
}


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
    p.add_argument("--capacity-base", choices=["alone", "together"], default="alone",
                   help="the capacity --load multiplies: each victim's alone in its partition "
                   "(the issue's), or its throughput with both victims flat out together, "
                   "no best effort (what it can do beside its critical neighbour: session 29 "
                   "found trio c's light CNN ~95 %% busy at 75 %% of its alone capacity)")
    p.add_argument("--slack", type=float, default=1.3)
    p.add_argument("--deadline-base", choices=["alone", "together", "both"], default="alone",
                   help="the p99 the deadline multiplies: each victim alone in its partition, "
                   "or in the victims-only baseline of the same point (the critical set "
                   "together, without best effort: the median over its repeats), or both "
                   "(the variants run under each)")
    p.add_argument("--budget-s", type=float, default=0,
                   help="start no run after this many seconds (0: no limit); the rows left "
                   "out are listed in protection.md")
    p.add_argument("--mechanisms", default="green,mps,timeslice")
    p.add_argument("--variants", default="none,pri,guard,both,stretch")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--loads", default="", help="trade-off loads, e.g. 0.5,0.6,0.7,0.8,0.9")
    p.add_argument("--tradeoff-mechanism", default="green")
    p.add_argument("--tradeoff-variants", default="none,both")
    p.add_argument("--duration", type=float, default=3.0)
    p.add_argument("--piece-us", type=int, default=100)
    p.add_argument("--margin-us", type=int, default=20)
    p.add_argument("--alone-only", action="store_true",
                   help="measure each workload alone (alone.json) and stop")
    p.add_argument("--l2-mib", type=int, default=24,
                   help="l2_persist_mib of the l2 and levers variants")
    p.add_argument("--skip-alone", action="store_true",
                   help="reuse <out>/alone.json from an earlier run of this script")
    p.add_argument("--alone-base-repeats", type=int, default=None,
                   help="with --deadline-base both: how many of the repeats also run the "
                   "variants at the alone deadline (default: every one); the victims-only "
                   "runs, at the alone deadline, still say what admission predicted in each")
    p.add_argument("--no-single-baselines", action="store_true",
                   help="leave out each victim alone at its rate (the only-X rows)")
    args = p.parse_args()
    if args.alone_base_repeats is not None and args.alone_base_repeats < 0:
        p.error(f"--alone-base-repeats must be 0 or more (got {args.alone_base_repeats})")
    unknown = [v for v in args.variants.split(",") + args.tradeoff_variants.split(",")
               if lever(v)[0] not in VARIANTS or 0 in lever(v)[1:]
               or (lever(v)[2] or 0) > (lever(v)[1] or args.piece_us)]
    if unknown:
        p.error(f"unknown variant(s) {unknown}; allowed: {', '.join(VARIANTS)}, each "
                "optionally @N for pieces of N µs (N >= 20) and ~F for runs of fine pieces "
                "of F µs (20 <= F <= the piece length)")
    return args


def lever(variant):
    """(variant, piece µs or None, fine piece µs or None) of `share@25`, `both~25` or
    `both@100~25`; 0 for a length that is not an integer of at least 20 µs (the scenario's
    bound)."""
    us = lambda t: int(t) if t.isdigit() and int(t) >= 20 else 0
    rest, tilde, fine = variant.partition("~")
    name, at, piece = rest.partition("@")
    return name, us(piece) if at else None, us(fine) if tilde else None


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
    return {"vit_b_16": "spin:1ms", "resnet18": "spin:0.5ms", "vit_l_32": "spin:3ms",
            "resnet50": "spin:0.8ms", "mobilenet_v2": "spin:0.6ms",
            "convnext_base": "spin:1.5ms"}.get(model, model)


def workload_toml(args, w, mech):
    """One [[workload]] table. w: name, model, sms, rate (None: max), deadline_ms, criticality."""
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
    if w.get("stretch") and w["stretch"] > 1.0:
        lines.append(f'stretch = {w["stretch"]:.3f}')
    if args.backend == "cuda" and mech == "green":
        lines.append(f'partition = {{ sms = {w["sms"]} }}')
    elif args.backend == "cuda" and mech == "mps":
        lines.append(f'partition = {{ thread_pct = {max(1, round(100 * w["sms"] / TOTAL_SMS))} }}')
    return "\n".join(lines)


def scenario_toml(args, mech, workloads, variant="none", stretch=None):
    if args.backend == "cuda":
        host = "thread" if mech == "green" else "process"
        device = f'[device]\nbackend = "cuda"\nmechanism = "{mech}"\nhost = "{host}"\n'
    else:
        device = '[device]\nbackend = "cpu"\nhost = "thread"\n'
    variant, piece_us, fine_us = lever(variant)
    enabled, guard, priorities, with_stretch = VARIANTS[variant]
    flag = lambda b: "true" if b else "false"
    prot = (f"[protection]\nenabled = {flag(enabled)}\nguard = {flag(guard)}\n"
            f"priorities = {flag(priorities)}\n"
            f"piece_us = {piece_us or args.piece_us}\nmargin_us = {args.margin_us}\n")
    if fine_us:
        prot += f"fine_piece_us = {fine_us}\n"
    prot += "".join(k.format(l2=args.l2_mib) + "\n" for k in LEVER_KEYS.get(variant, []))
    if with_stretch and stretch:
        workloads = [dict(w, stretch=stretch.get(w["name"])) for w in workloads]
    body = "\n\n".join(workload_toml(args, w, mech) for w in workloads)
    return f"{device}\n{prot}\n{body}\n"


def run(exe, folder, text):
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


def jobs(run_dir, workload):
    """(release, start, end, timeout) of a run's completed jobs, in ms, by release."""
    with open(os.path.join(run_dir, "jobs", workload + ".csv")) as f:
        return [(float(r["release_ms"]), float(r["start_ms"]), float(r["end_ms"]),
                 r["timeout"] == "1") for r in csv.DictReader(f) if r["end_ms"]]


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(len(v) * q))] if v else float("nan")


def busy(spans, a, b):
    """Whether any of the sorted (start, end) `spans` overlaps [a, b]."""
    i = bisect.bisect_left(spans, (a, a))
    return any(s < b and e > a for s, e in spans[max(0, i - 1):i + 2])


# The guard's account of best effort's time, one line in the run's log at its end
# (crates/isolane-runtime/src/guard.rs, HoldAccount::line): each share of the time from its
# first ask to its last piece's end, in %.
HOLD_WORDS = {
    "too long for the slack": "too_long",
    "no slack in a running critical job": "running",
    "no slack before the next critical job": "next",
    "between critical jobs": "between",
    "the sharing loop's budget spent": "budget",
    "a critical backlog": "backlog",
    "a critical job past its estimate": "overrun",
}


def hold_account(log_text):
    """{ran, piece_us, held, too_long, running, next, between, budget, backlog, overrun} (% of
    the time; µs a piece, or with fine pieces µs a run: a launch waited for) from a run's log,
    or {} where the guard said nothing (no piece ran)."""
    m = re.search(r"best effort time: [\d.]+ ms; ran \d+ (?:pieces|runs) [\d.]+ ms "
                  r"\(([\d.]+) %, ([\d.]+) µs a (?:piece|run)[^)]*\); held [\d.]+ ms "
                  r"\(([\d.]+) %\): (.*)", log_text)
    if not m:
        return {}
    out = dict(ran=float(m.group(1)), piece_us=float(m.group(2)), held=float(m.group(3)))
    for words, ms, share in re.findall(r"([a-z (),']+?) ([\d.]+) ms \(([\d.]+) %\)", m.group(4)):
        key = HOLD_WORDS.get(words.strip(", "))
        if key:
            out[key] = float(share)
    return out


def attribute(run_dir, victims, deadlines):
    """Per victim: misses, of them `queued` (started too late for its execution alone to fit)
    and `slow` (own execution too long), and the slow ones the other victim overlapped."""
    spans = {v: sorted((s, e) for _, s, e, _ in jobs(run_dir, v)) for v in victims}
    out = {}
    for v in victims:
        d = deadlines[v]
        others = [spans[o] for o in victims if o != v]
        n = dict(misses=0, queued=0, slow=0, slow_beside_victim=0)
        exec_ms = sorted(e - s for _, s, e, _ in jobs(run_dir, v))
        typical = pct(exec_ms, 0.5)
        for rel, s, e, late in jobs(run_dir, v):
            if not late:
                continue
            n["misses"] += 1
            if s - rel + typical > d:
                n["queued"] += 1
            else:
                n["slow"] += 1
                if any(busy(o, s, e) for o in others):
                    n["slow_beside_victim"] += 1
        out[v] = n
    return out


class Study:
    def __init__(self, args):
        self.args = args
        self.exe = binary(args)
        victims = [split(v) for v in args.victims.split(",")]
        be_model, be_sms = split(args.best_effort)
        self.victims = [dict(name=f"v{i}_{m}", model=m, sms=s) for i, (m, s) in enumerate(victims)]
        self.be = dict(name=f"be_{be_model}", model=be_model, sms=be_sms,
                       criticality="best_effort")
        self.mechanisms = [m for m in args.mechanisms.split(",")
                           if m and (args.backend == "cuda" or m == "green")]
        self.alone = {}
        self.deadlines = {}
        self.rows = []
        self.misses = []
        # The victims-only runs' folders, to score them against the together deadline too.
        self.victims_only = {}
        self.started = time.time()
        self.skipped = []

    def measure_alone(self):
        path = os.path.join(self.args.out, "alone.json")
        if self.args.skip_alone and os.path.exists(path):
            with open(path) as f:
                self.alone = json.load(f)
            return
        for mech in set(self.mechanisms + [self.args.tradeoff_mechanism]):
            self.alone[mech] = {}
            for w in self.victims + [self.be]:
                w = dict(w, criticality="critical")
                folder = os.path.join(self.args.out, "alone", mech, w["name"])
                s = run(self.exe, folder, scenario_toml(self.args, mech, [w]))[w["name"]]
                ex = [e - st for _, st, e, _ in jobs(os.path.join(folder, "run"), w["name"])]
                self.alone[mech][w["name"]] = dict(
                    capacity=s["throughput_ips"], p99=s["latency_ms"]["p99"],
                    exec_p99=pct(ex, .99))
            if self.args.capacity_base == "together":
                # Both victims flat out together (closed loop), no best effort: each one's
                # throughput beside the other.
                vs = [dict(v, criticality="critical") for v in self.victims]
                # Beside alone/, which levers-h200.sh reads as one workload a folder.
                folder = os.path.join(self.args.out, "victims-together", mech)
                s = run(self.exe, folder, scenario_toml(self.args, mech, vs))
                for v in self.victims:
                    self.alone[mech][v["name"]]["capacity_together"] = \
                        s[v["name"]]["throughput_ips"]
        with open(path, "w") as f:
            json.dump(self.alone, f, indent=1)

    def victims_at(self, mech, load):
        key = "capacity_together" if self.args.capacity_base == "together" else "capacity"
        return [dict(v, rate=load * self.alone[mech][v["name"]][key],
                     deadline_ms=self.args.slack * self.alone[mech][v["name"]]["p99"])
                for v in self.victims]

    def one(self, study, mech, load, label, rep, workloads, variant="none", stretch=None,
            base="alone"):
        if self.args.budget_s and time.time() - self.started > self.args.budget_s:
            self.skipped.append(f"{mech} {base} {label} r{rep}")
            print(f"over --budget-s {self.args.budget_s:.0f}: {self.skipped[-1]} not run",
                  flush=True)
            return
        tag = "" if base == "alone" else "-" + base
        folder = os.path.join(self.args.out, study,
                              f"{mech}-load{round(load * 100)}-{label}{tag}", f"r{rep}")
        s = run(self.exe, folder, scenario_toml(self.args, mech, workloads, variant, stretch))
        run_dir = os.path.join(folder, "run")
        if label == "victims-only":
            self.victims_only[(study, mech, load, rep)] = run_dir
        names = [w["name"] for w in workloads if w.get("criticality") != "best_effort"]
        deadlines = {w["name"]: w["deadline_ms"] for w in workloads if w.get("deadline_ms")}
        blame = attribute(run_dir, names, deadlines)
        # What admission predicted before the run (`[protection] admission`, on by default):
        # the workloads its warning named.
        with open(os.path.join(folder, "log.txt")) as f:
            log_text = f.read()
        warned = [line.split("'")[1] for line in log_text.splitlines()
                  if line.strip().startswith("workload '") and "predicted p99" in line]
        account = hold_account(log_text)
        for name, w in s.items():
            ex = [e - st for _, st, e, _ in jobs(run_dir, name)]
            a = self.alone[mech][name]
            held = w.get("held") or {}
            is_be = name == self.be["name"]
            self.rows.append(dict(
                study=study, mechanism=mech, load=load, base=base, variant=label, repeat=rep,
                workload=name, criticality=w.get("criticality", ""),
                jobs=w["jobs"], timeout_pct=w["timeout_pct"],
                p50_ms=w["latency_ms"]["p50"], p99_ms=w["latency_ms"]["p99"],
                max_ms=w["latency_ms"]["max"], exec_p99_ms=pct(ex, .99),
                exec_stretch=pct(ex, .99) / a["exec_p99"],
                throughput_ips=w["throughput_ips"],
                of_alone=w["throughput_ips"] / a["capacity"] if is_be else "",
                held_ms=held.get("total_ms", 0),
                stretch=(stretch or {}).get(name, ""),
                predicted_miss=int(name in warned),
                **{f"be_{k}": (account.get(k, "") if is_be else "")
                   for k in ("ran", "piece_us", "held") + tuple(HOLD_WORDS.values())}))
            if name in blame:
                self.misses.append(dict(study=study, mechanism=mech, load=load, base=base,
                                        variant=label, repeat=rep, workload=name,
                                        **blame[name]))
        self.write(quiet=True)

    def rescore_victims_only(self, study, mech, load, deadlines):
        """The victims-only runs (no best effort: the guard has nothing to hold) scored against
        the together deadline, as rows of that base."""
        for (st, m, ld, rep), run_dir in sorted(self.victims_only.items()):
            if (st, m, ld) != (study, mech, load):
                continue
            for r in [r for r in self.rows if r["base"] == "alone" and r["repeat"] == rep
                      and (r["study"], r["mechanism"], r["load"], r["variant"])
                      == (study, mech, load, "victims-only")]:
                name = r["workload"]
                with open(os.path.join(run_dir, "jobs", name + ".csv")) as f:
                    lat = [float(j["end_ms"]) - float(j["release_ms"]) if j["end_ms"]
                           else float("inf") for j in csv.DictReader(f)]
                late = sum(1 for x in lat if x > deadlines[name])
                # Admission saw the alone deadline this run had, never this one: its
                # warning is not carried over ("" reads "not asked" in protection.md).
                self.rows.append(dict(r, base="together", predicted_miss="",
                                      timeout_pct=100.0 * late / max(1, len(lat))))
            blame = attribute(run_dir, list(deadlines), deadlines)
            for name, n in blame.items():
                self.misses.append(dict(study=study, mechanism=mech, load=load,
                                        base="together", variant="victims-only", repeat=rep,
                                        workload=name, **n))

    def exec_p99(self, study, mech, load, variant, rep=0):
        """Each critical workload's execution p99 (ms) in one run of this point."""
        return {r["workload"]: r["exec_p99_ms"] for r in self.rows
                if (r["study"], r["mechanism"], r["load"], r["variant"], r["repeat"])
                == (study, mech, load, variant, rep) and r["criticality"] == "critical"}

    def victim_stretches(self, study, mech, load):
        """Each victim's stretch by best effort: its p99 execution time in the first unprotected
        run of this point over the victims-only baseline's (over alone without baselines)."""
        beside = self.exec_p99(study, mech, load, "none")
        base = self.exec_p99(study, mech, load, "victims-only")
        return {n: max(1.0, ex / base.get(n, self.alone[mech][n]["exec_p99"]))
                for n, ex in beside.items()}

    def compare(self, study, mech, load, variants, baselines):
        vs = self.victims_at(mech, load)
        bases = (["alone", "together"] if self.args.deadline_base == "both"
                 else [self.args.deadline_base])
        # The baselines first, the victims-only one repeated: the together deadline is the
        # median of its p99s, and the row itself moved between calls on the H200.
        if baselines and not self.args.no_single_baselines:
            for v in vs:
                self.one(study, mech, load, f"only-{v['name']}", 0, [v])
        if baselines or "together" in bases:
            for rep in range(self.args.repeats):
                self.one(study, mech, load, "victims-only", rep, vs)
        by_base = {"alone": vs}
        if "together" in bases:
            p99s = {}
            for r in self.rows:
                if (r["study"], r["mechanism"], r["load"], r["variant"], r["base"]) \
                        == (study, mech, load, "victims-only", "alone"):
                    p99s.setdefault(r["workload"], []).append(r["p99_ms"])
            if len(p99s) < len(vs):
                self.skipped.append(f"{mech} together: no victims-only run, no deadline")
                bases.remove("together")
            else:
                dl = {n: self.args.slack * statistics.median(p) for n, p in p99s.items()}
                by_base["together"] = [dict(v, deadline_ms=dl[v["name"]]) for v in vs]
                self.deadlines[(study, mech, load)] = dl
                self.rescore_victims_only(study, mech, load, dl)
        # Repeat by repeat, each base and variant once in each: a study cut short by
        # --budget-s has fewer repeats of every row rather than no row of some.
        alone_reps = self.args.alone_base_repeats
        for rep in range(self.args.repeats):
            for base in bases:
                if base == "alone" and len(bases) > 1 and alone_reps is not None \
                        and rep >= alone_reps:
                    continue
                for variant in variants:
                    stretch = (self.victim_stretches(study, mech, load) if variant == "stretch"
                               else None)
                    self.one(study, mech, load, variant, rep, by_base[base] + [self.be],
                             variant, stretch, base=base)

    def main(self):
        os.makedirs(self.args.out, exist_ok=True)
        self.measure_alone()
        if self.args.alone_only:
            return
        for mech in self.mechanisms:
            variants = self.args.variants.split(",")
            if mech == "timeslice":  # two victims at 75 % each cannot share by turns: no levers
                variants = [v for v in variants if v in ("none", "both")]
            self.compare("compare", mech, self.args.load, variants, baselines=True)
        for load in [float(x) for x in self.args.loads.split(",") if x]:
            self.compare("tradeoff", self.args.tradeoff_mechanism, load,
                         self.args.tradeoff_variants.split(","), baselines=False)
        self.write()

    def write(self, quiet=False):
        out = self.args.out
        for name, rows in (("protection.csv", self.rows), ("misses.csv", self.misses)):
            if rows:
                with open(os.path.join(out, name), "w", newline="") as f:
                    wr = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
                    wr.writeheader()
                    wr.writerows(rows)
        with open(os.path.join(out, "protection.md"), "w") as f:
            f.write(markdown(self))
        if not quiet:
            print(open(os.path.join(out, "protection.md")).read())


def markdown(st):
    a = st.args
    be = st.be["name"]
    out = [f"# Criticality protection ({a.backend}, {a.precision})", "",
           f"Critical victims at {a.load:.0%} of their "
           + ("capacity beside each other (both flat out together, no best effort)"
              if a.capacity_base == "together" else "alone-in-partition capacity")
           + " (trade-off: "
           f"other loads), deadline {a.slack} x their p99 "
           + {"alone": "alone",
              "together": "in the victims-only baseline (both victims at that load, no best "
              "effort: the median of its repeats' p99; the baselines' own timeouts count "
              "against the alone deadline unless the row's base says together)",
              "both": "alone (base `alone`) and, in rows of base `together`, x their p99 in "
              "the victims-only baseline (the median of its repeats' p99; its runs scored "
              "against both)"}[a.deadline_base]
           + f"; best effort `{be}` flat out; "
           f"pieces of {a.piece_us} µs, margin {a.margin_us} µs; {a.duration} s per run, "
           f"{a.repeats} repeats (each cell: median [min-max] over them). Variants: none (unprotected), pri (priorities only), guard "
           "(guard only, full-stall model), both (guard + priorities, the default), stretch "
           "(guard with each victim's own stretch by best effort: p99 execution time in the first "
           "unprotected run over the victims-only baseline's, + priorities); slack / share / l2: "
           "both + `slack_order` / `share` / `l2_persist_mib` (issue 34's levers), levers: all "
           "three; VARIANT@N: with pieces of N µs; victims-only / only-X: the baselines without "
           "best effort.", "",
           "| mechanism | workload | alone capacity /s | alone p99 ms | alone exec p99 ms "
           "| capacity beside the other victim /s |",
           "| --- | --- | --- | --- | --- | --- |"]
    for mech, ws in st.alone.items():
        out += [f"| {mech} | {n} | {w['capacity']:.1f} | {w['p99']:.3f} | {w['exec_p99']:.3f} "
                f"| {w['capacity_together']:.1f} |" if "capacity_together" in w else
                f"| {mech} | {n} | {w['capacity']:.1f} | {w['p99']:.3f} | {w['exec_p99']:.3f} | — |"
                for n, w in ws.items()]
    if st.deadlines:
        out += ["", "| study | mechanism | load | " + " | ".join(
            f"{v['name']} deadline ms" for v in st.victims) + " |",
                "| --- | --- | --- |" + " --- |" * len(st.victims)]
        out += [f"| {k[0]} | {k[1]} | {k[2]:.2f} | " + " | ".join(
            f"{d[v['name']]:.3f}" for v in st.victims) + " |" for k, d in st.deadlines.items()]
    victims = [v["name"] for v in st.victims]
    for study in ("compare", "tradeoff"):
        keys = []
        for r in st.rows:
            k = (r["mechanism"], r["load"], r["base"], r["variant"])
            if r["study"] == study and k not in keys:
                keys.append(k)
        if not keys:
            continue
        out += ["", f"## {study}: median [min-max] over repeats", "",
                "| mechanism | load | deadline base | variant | runs | " + " | ".join(
                    f"{v} timeouts %" for v in victims) + " | victim max ms | best effort "
                "of alone | misses queued / slow (beside the other victim) | admission "
                "predicted a miss of |",
                "| --- | --- | --- | --- | --- |" + " --- |" * len(victims)
                + " --- | --- | --- | --- |"]
        for k in keys:
            rs = [r for r in st.rows if r["study"] == study
                  and (r["mechanism"], r["load"], r["base"], r["variant"]) == k]
            runs = sorted({r["repeat"] for r in rs})
            cells = []
            for v in victims:
                t = [r["timeout_pct"] for r in rs if r["workload"] == v]
                cells.append(f"{statistics.median(t):.2f} [{min(t):.2f}-{max(t):.2f}]"
                             if t else "—")
            mx = [r["max_ms"] for r in rs if r["workload"] in victims]
            b = [r["of_alone"] for r in rs if r["workload"] == be]
            ms = [m for m in st.misses if m["study"] == study
                  and (m["mechanism"], m["load"], m["base"], m["variant"]) == k]
            q = sum(m["queued"] for m in ms)
            s = sum(m["slow"] for m in ms)
            sv = sum(m["slow_beside_victim"] for m in ms)
            warned = sorted({r["workload"] for r in rs if r.get("predicted_miss")})
            asked = any(r.get("predicted_miss") != "" for r in rs)
            out.append(f"| {k[0]} | {k[1]:.2f} | {k[2]} | {k[3]} | {len(runs)} | "
                       + " | ".join(cells) + f" | {max(mx):.2f} | " +
                       (f"{statistics.median(b):.1%} [{min(b):.1%}-{max(b):.1%}]" if b
                        else "—") +
                       f" | {q} / {s} ({sv}) | "
                       + (", ".join(warned) or "—" if asked
                          else "not asked (ran at the alone deadline)") + " |")
    if st.skipped:
        out += ["", f"Not run (over --budget-s {a.budget_s:.0f} s, or no baseline): "
                + ", ".join(st.skipped) + "."]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    Study(parse_args()).main()
