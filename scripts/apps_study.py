#!/usr/bin/env python3
"""Paper 004's study (issue 16 item 5, docs/apps.md): 1 to 6 concurrent endoscopy-like apps on
one GPU, with no partitions, MPS partitions and green partitions, end to end as Holoscan
measures it.

Each app: synthetic 1920x1080 frames at 60 fps -> the CUDA preprocess -> YOLOv8n (fp16) -> box
decode + NMS -> (--graphics) the Vulkan visualization stage on the same GPU -> sink, 50 ms end
to end. For every number of apps N and every mechanism:
  timeslice  no partitions: each app an `isolane worker` process, the GPU time-sliced between
             their contexts (the paper's baseline);
  mps        each app an MPS client with 100/N % of the threads and --mem-limit-mib of pinned
             device memory (the paper's MPS partitions);
  green      each app's models in a green context of --total-sms/N SMs, rounded down to the
             device's step (--sm-step), in threads of one process.
Per run and app: frames, timeout %, mean, max, tail (p100 - p95) and flatness (p90 - p10) of
the end-to-end latency, and the GPU's mean utilisation (NVML). Per N and mechanism: the worst
app's max latency and the mean flatness, and their reduction against `timeslice` at the same N
(the paper: MPS partitions cut the max latency by 21-30 % and flatness by 17-25 %).

    scripts/apps_study.py --out results/h100-apps-study                    # on the GPU machine
    scripts/apps_study.py --backend cpu --apps 1,2 --duration 4 --out /tmp/s   # harness check

Writes <out>/<mech>-n<N>/ (each run's folder), <out>/apps-study.csv and <out>/apps-study.md;
the table covers every run found in <out>, so a study split over several calls (--apps 1,2,3
then --apps 4,5,6) ends with one table.
Python >= 3.7, standard library only.
"""

import argparse
import csv
import json
import os
import re
import statistics
import subprocess
import sys


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--isolane", default=None,
                   help="the isolane binary (default: stage/isolane, else target/release/isolane)")
    p.add_argument("--out", required=True)
    p.add_argument("--backend", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--apps", default="1,2,3,4,5,6", help="numbers of concurrent apps")
    p.add_argument("--mechanisms", default="timeslice,mps,green")
    p.add_argument("--duration", type=float, default=20.0, help="seconds per run")
    p.add_argument("--deadline-ms", type=float, default=None,
                   help="end-to-end deadline (default 50 ms on cuda, 2000 ms for the CPU check)")
    p.add_argument("--fps", type=float, default=60.0)
    p.add_argument("--model", default="yolov8n")
    p.add_argument("--graphics", action=argparse.BooleanOptionalAction, default=True,
                   help="a Vulkan visualization stage in every app (default on)")
    p.add_argument("--total-sms", type=int, default=132)
    p.add_argument("--sm-step", type=int, default=8)
    p.add_argument("--mem-limit-mib", type=int, default=4096)
    a = p.parse_args()
    a.apps = [int(n) for n in a.apps.split(",") if n]
    if not a.apps or any(n < 1 for n in a.apps):
        p.error("--apps: positive numbers of apps, e.g. 1,2,3")
    a.mechanisms = [m for m in a.mechanisms.split(",") if m]
    bad = [m for m in a.mechanisms if m not in ("timeslice", "mps", "green")]
    if bad:
        p.error(f"--mechanisms: unknown {bad}; allowed: timeslice, mps, green")
    if a.backend == "cpu":
        a.mechanisms = ["cpu"]
    if a.deadline_ms is None:
        a.deadline_ms = 50.0 if a.backend == "cuda" else 2000.0
    return a


def binary(a):
    for b in [a.isolane, "stage/isolane", "target/release/isolane"]:
        if b and os.path.exists(b):
            return os.path.abspath(b)
    sys.exit("no isolane binary: pass --isolane")


def green_sms(a, n):
    """Each of n apps' SMs: an equal share, rounded down to the device's step (at least one)."""
    return max(a.sm_step, a.total_sms // n // a.sm_step * a.sm_step)


def frames(a):
    """Width, height and rate of the source: 1080p on the GPU; small frames on the CPU, so that
    the harness check takes seconds."""
    return (1920, 1080, a.fps) if a.backend == "cuda" else (160, 120, 5)


def partition(a, mech, n):
    if mech == "mps":
        return f"partition = {{ thread_pct = {max(1, 100 // n)}, mem_limit_mib = {a.mem_limit_mib} }}"
    if mech == "green":
        return f"partition = {{ sms = {green_sms(a, n)} }}"
    return None


def scenario(a, mech, n):
    """The scenario text of n apps under `mech`."""
    cuda = a.backend == "cuda"
    lines = ["[device]", f'backend = "{a.backend}"']
    if cuda:
        lines.append(f'mechanism = "{mech}"')
    width, height, fps = frames(a)
    for i in range(1, n + 1):
        lines += ["", "[[app]]", f'name = "endoscopy{i}"', f"deadline_ms = {a.deadline_ms}",
                  f"duration_s = {a.duration}"]
        if cuda:
            lines.append('precision = "fp16"')
            part = partition(a, mech, n)
            if part:
                lines.append(part)
        lines += ["", "[app.source]", 'kind = "synthetic"', f"width = {width}",
                  f"height = {height}", f"fps = {fps}"]
        stages = [("preprocess", "preprocess", ['device = "gpu"'] if cuda else []),
                  ("detector", "model", [f'model = "{a.model}"']),
                  ("boxes", "yolov8_decode", [])]
        if a.graphics:
            stages.append(("draw", "graphics", []))
        stages.append(("display", "sink", []))
        for name, kind, extra in stages:
            lines += ["", "[[app.stage]]", f'name = "{name}"', f'kind = "{kind}"'] + extra
    return "\n".join(lines) + "\n"


def run(exe, folder, text):
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "scenario-in.toml")
    with open(path, "w") as f:
        f.write(text)
    out = os.path.join(folder, "run")
    cmd = [exe, "run", "-q", "--force", "--out", out, path]
    print("$", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout + p.stderr)
        return None
    try:
        with open(os.path.join(out, "summary.json")) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        sys.stderr.write(f"{out}: no readable summary.json ({e})\n")
        return None


def rows_of(summary, mech, n):
    """One row per app of a run's summary.json."""
    tele = summary.get("telemetry") or {}
    util = (tele.get("gpu_util_pct") or {}).get("mean")
    out = []
    for app in summary.get("apps", []):
        e = app["end_to_end"]
        lat = e["latency_ms"]
        out.append(dict(mechanism=mech, apps=n, app=app["name"], frames=e["jobs"],
                        timeout_pct=e["timeout_pct"], mean_ms=lat["mean"], max_ms=lat["max"],
                        tail_ms=lat["tail"], flatness_ms=lat["flatness"], p99_ms=lat["p99"],
                        gpu_util_pct=util))
    return out


def summarise(rs):
    """The worst app's max latency, the mean flatness and the mean tail of one configuration
    (None where no app of it had a measured frame reach its sink)."""
    def values(key):
        return [r[key] for r in rs if r[key] is not None]
    maxes, flats, tails = values("max_ms"), values("flatness_ms"), values("tail_ms")
    return (max(maxes) if maxes else None, statistics.mean(flats) if flats else None,
            statistics.mean(tails) if tails else None)


def num(v, digits):
    return "—" if v is None else f"{v:.{digits}f}"


def reduction(value, base):
    return 1.0 - value / base if value is not None and base else None


def change(cut):
    """A reduction written as the value's change: a 25 % cut is "−25 %"."""
    if cut is None:
        return "—"
    return f"−{cut:.0%}" if cut >= 0 else f"+{-cut:.0%}"


def markdown(a, rows):
    width, height, fps = frames(a)
    precision = "fp16" if a.backend == "cuda" else "fp32"
    out = ["# Paper 004's study: concurrent endoscopy apps", "",
           f"{a.backend}, {a.model} {precision}, {width}x{height} at {fps:g} fps, deadline "
           f"{a.deadline_ms:g} ms, {a.duration:g} s per run, graphics stage "
           f"{'on' if a.graphics else 'off'}; first and last 10 frames dropped (Holoscan's "
           "definition). Per app: `apps-study.csv`.", "",
           "| apps | mechanism | worst max ms | mean flatness ms | mean tail ms | worst timeout % "
           "| GPU util % | max latency vs timeslice | flatness vs timeslice |",
           "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    agg = {}
    for r in rows:
        agg.setdefault((r["apps"], r["mechanism"]), []).append(r)
    for (n, mech), rs in sorted(agg.items()):
        worst, flat, tail = summarise(rs)
        miss = max(r["timeout_pct"] for r in rs)
        util = rs[0]["gpu_util_pct"]
        base = agg.get((n, "timeslice"))
        cut_max = cut_flat = None
        if base and mech != "timeslice":
            b_worst, b_flat, _ = summarise(base)
            cut_max = reduction(worst, b_worst)
            cut_flat = reduction(flat, b_flat)
        out.append(f"| {n} | {mech} | {num(worst, 1)} | {num(flat, 2)} | {num(tail, 2)} | "
                   f"{miss:.2f} | {num(util, 0)} | {change(cut_max)} | {change(cut_flat)} |")
    out += ["", "Reductions are written as changes of the value: −25 % is a 25 % cut against "
            "time-slicing with the same number of apps (paper 004: MPS partitions −21 to −30 % "
            "max latency, −17 to −25 % flatness)."]
    return "\n".join(out) + "\n"


def collect(out):
    """The rows of every run under `out`, this call's and earlier ones' (a study split over
    several device calls writes one table)."""
    rows = []
    for name in sorted(os.listdir(out)):
        m = re.fullmatch(r"(timeslice|mps|green|cpu)-n(\d+)", name)
        path = os.path.join(out, name, "run", "summary.json")
        if not m or not os.path.exists(path):
            continue
        try:
            with open(path) as f:
                rows += rows_of(json.load(f), m.group(1), int(m.group(2)))
        except (OSError, ValueError, KeyError) as e:
            sys.stderr.write(f"{path}: left out ({e})\n")
    return rows


def main():
    a = parse_args()
    exe = binary(a)
    os.makedirs(a.out, exist_ok=True)
    failed = []
    for n in a.apps:
        for mech in a.mechanisms:
            if run(exe, os.path.join(a.out, f"{mech}-n{n}"), scenario(a, mech, n)) is None:
                failed.append(f"{mech}-n{n}")
    rows = collect(a.out)
    if rows:
        with open(os.path.join(a.out, "apps-study.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
            w.writeheader()
            w.writerows(rows)
        md = markdown(a, rows)
        with open(os.path.join(a.out, "apps-study.md"), "w") as f:
            f.write(md)
        print(md)
    if failed:
        print("failed runs: " + ", ".join(failed), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
