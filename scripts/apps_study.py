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
             device's step (--sm-step), in threads of one process;
  protected  (N >= 2) MPS partitions as `mps`, with isolane's criticality protection: app 1
             critical, the others best effort (docs/criticality.md, Apps). Compared with `mps`
             at the same N for app 1, in a table of its own.
Per run and app: frames, timeout %, mean, max, tail (p100 - p95) and flatness (p90 - p10) of
the end-to-end latency, and the GPU's mean utilisation (NVML). Per N and mechanism: the worst
app's max latency and the mean flatness, and their reduction against `timeslice` at the same N
(the paper: MPS partitions cut the max latency by 21-30 % and flatness by 17-25 %).

    scripts/apps_study.py --out results/h100-apps-study                    # on the GPU machine
    scripts/apps_study.py --backend cpu --apps 1,2 --duration 4 --out /tmp/s   # harness check

Two GPUs (--gpus 2, issue 18, paper 004's second lever), every app's compute under --mechanisms
(default mps, the paper's MPS partitions) in each layout:
  a  everything on GPU 0 (compute and graphics), GPU 1 idle;
  b  the default multi-GPU set-up: the apps spread over the GPUs, each computing and rendering
     on its own (the baseline of the comparison);
  c  compute on GPU 0, every graphics stage on GPU 1 (frames through host memory).
Each GPU's thread share or SMs are split between the apps computing on it. The paper: (c)
against (b) cut the max latency by 35 % and raised GPU utilisation by 42 %.

    scripts/apps_study.py --gpus 2 --apps 1,2,3 --out results/h100x2-apps-study

Writes <out>/[<layout>-]<mech>-n<N>/ (each run's folder), <out>/apps-study.csv and <out>/apps-study.md;
the table covers every run found in <out>, so a study split over several calls (--apps 1,2,3
then --apps 4,5,6) ends with one table.
Python >= 3.7, standard library only.
"""

import argparse
import csv
import gzip
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
    p.add_argument("--gpus", type=int, choices=[1, 2], default=1,
                   help="2: the layouts a, b, c on GPUs 0 and 1 (default mechanisms: mps)")
    p.add_argument("--layouts", default="a,b,c", help="with --gpus 2: which of a, b, c")
    p.add_argument("--run-slack", type=float, default=120.0,
                   help="seconds a run may take beyond --duration (building the apps) before it "
                        "is stopped and counted as failed")
    p.add_argument("--warmup-s", type=float, default=1.0,
                   help="the second table leaves out the frames released in the first this many "
                        "seconds: a one-time stall there (frames 10-35) set most runs' max latency")
    p.add_argument("--protection-stretch", type=float, default=None,
                   help="protected runs: [protection] stretch, the worst slowdown of app 1 beside "
                        "best effort (default unset: a full stall, docs/criticality.md)")
    p.add_argument("--table-only", action="store_true",
                   help="run nothing: write the table of the runs already in --out")
    a = p.parse_args()
    a.apps = [int(n) for n in a.apps.split(",") if n]
    if not a.apps or any(n < 1 for n in a.apps):
        p.error("--apps: positive numbers of apps, e.g. 1,2,3")
    if a.gpus == 2 and a.mechanisms == p.get_default("mechanisms"):
        a.mechanisms = "mps"
    a.mechanisms = [m for m in a.mechanisms.split(",") if m]
    a.layouts = [x for x in a.layouts.split(",") if x] if a.gpus == 2 else ["one"]
    if any(x not in ("a", "b", "c", "one") for x in a.layouts):
        p.error(f"--layouts: {a.layouts}; allowed: a, b, c")
    if a.gpus == 2 and a.backend == "cpu":
        p.error("--gpus 2 needs --backend cuda")
    bad = [m for m in a.mechanisms if m not in ("timeslice", "mps", "green", "protected")]
    if bad:
        p.error(f"--mechanisms: unknown {bad}; allowed: timeslice, mps, green, protected")
    if a.backend == "cpu":
        a.mechanisms = ["cpu"] + [m for m in a.mechanisms if m == "protected"]
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


def partition(a, mech, sharing):
    """An app's partition when `sharing` apps compute on its GPU."""
    if mech in ("mps", "protected"):
        return (f"partition = {{ thread_pct = {max(1, 100 // sharing)}, "
                f"mem_limit_mib = {a.mem_limit_mib} }}")
    if mech == "green":
        return f"partition = {{ sms = {green_sms(a, sharing)} }}"
    return None


def placement(layout, i):
    """App i's compute GPU and its graphics stage's GPU (None: one GPU, no keys)."""
    if layout == "one":
        return None, None
    if layout == "b":
        return i % 2, i % 2
    return 0, (1 if layout == "c" else 0)


def scenario(a, mech, n, layout="one"):
    """The scenario text of n apps under `mech` in `layout`."""
    cuda = a.backend == "cuda"
    lines = ["[device]", f'backend = "{a.backend}"']
    if cuda:
        lines.append(f'mechanism = "{"mps" if mech == "protected" else mech}"')
    if layout != "one":
        lines.append("gpus = [0, 1]")
    width, height, fps = frames(a)
    computing = [placement(layout, i)[0] for i in range(n)]
    for i in range(n):
        gpu, draw_gpu = placement(layout, i)
        lines += ["", "[[app]]", f'name = "endoscopy{i + 1}"', f"deadline_ms = {a.deadline_ms}",
                  f"duration_s = {a.duration}"]
        if gpu is not None:
            lines.append(f"gpu = {gpu}")
        if mech == "protected" and i > 0:
            lines.append('criticality = "best_effort"')
        if cuda:
            lines.append('precision = "fp16"')
            part = partition(a, mech, computing.count(gpu))
            if part:
                lines.append(part)
        lines += ["", "[app.source]", 'kind = "synthetic"', f"width = {width}",
                  f"height = {height}", f"fps = {fps}"]
        stages = [("preprocess", "preprocess", ['device = "gpu"'] if cuda else []),
                  ("detector", "model", [f'model = "{a.model}"']),
                  ("boxes", "yolov8_decode", [])]
        if a.graphics:
            stages.append(("draw", "graphics", [] if draw_gpu is None else [f"gpu = {draw_gpu}"]))
        stages.append(("display", "sink", []))
        for name, kind, extra in stages:
            lines += ["", "[[app.stage]]", f'name = "{name}"', f'kind = "{kind}"'] + extra
    if mech == "protected" and a.protection_stretch is not None:
        lines += ["", "[protection]", f"stretch = {a.protection_stretch}"]
    return "\n".join(lines) + "\n"


def run(exe, folder, text, run_timeout):
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "scenario-in.toml")
    with open(path, "w") as f:
        f.write(text)
    out = os.path.join(folder, "run")
    cmd = [exe, "run", "-q", "--force", "--out", out, path]
    print("$", " ".join(cmd), flush=True)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = p.communicate(timeout=run_timeout)
    except subprocess.TimeoutExpired:
        # SIGTERM first: isolane then stops its MPS daemons before it exits.
        p.terminate()
        try:
            stdout, stderr = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            stdout, stderr = p.communicate()
        sys.stderr.write(f"{out}: still running after {run_timeout:.0f} s, stopped\n{stdout}{stderr}")
        return None
    if p.returncode != 0:
        how = f"killed by signal {-p.returncode}" if p.returncode < 0 else f"exit {p.returncode}"
        sys.stderr.write(f"{out}: {how}\n{stdout}{stderr}")
        return None
    try:
        with open(os.path.join(out, "summary.json")) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        sys.stderr.write(f"{out}: no readable summary.json ({e})\n")
        return None


def utilisation(summary):
    """The mean GPU utilisation (%) of each GPU the run sampled, GPU 0 first."""
    per_gpu = summary.get("telemetry_per_gpu") or [summary.get("telemetry") or {}]
    return [(t.get("gpu_util_pct") or {}).get("mean") for t in per_gpu]


def rows_of(summary, layout, mech, n):
    """One row per app of a run's summary.json."""
    utils = utilisation(summary)
    known = [u for u in utils if u is not None]
    util = statistics.mean(known) if known else None
    out = []
    for app in summary.get("apps", []):
        e = app["end_to_end"]
        lat = e["latency_ms"]
        out.append(dict(layout=layout, mechanism=mech, apps=n, app=app["name"],
                        criticality=app.get("criticality", "critical"),
                        held_ms=(app.get("held") or {}).get("total_ms", 0.0),
                        frames=e["jobs"],
                        timeout_pct=e["timeout_pct"], mean_ms=lat["mean"], max_ms=lat["max"],
                        tail_ms=lat["tail"], flatness_ms=lat["flatness"], p99_ms=lat["p99"],
                        gpu_util_pct=util,
                        gpu_util_each=" / ".join("—" if u is None else f"{u:.0f}" for u in utils)))
    return out


def frame_rows(path):
    """The rows of an app's per-frame CSV (written plain, or gzipped when committed)."""
    for name, opener in ((path, open), (path + ".gz", gzip.open)):
        if os.path.exists(name):
            with opener(name, "rt", newline="") as f:
                return list(csv.DictReader(f))
    return []


def percentile(sorted_values, q):
    """Nearest rank, as the run's own statistics (q in 0..1)."""
    if not sorted_values:
        return None
    i = min(len(sorted_values) - 1, max(0, int(round(q * len(sorted_values) + 0.5)) - 1))
    return sorted_values[i]


def steady_rows(out, a):
    """Per app and run: the end-to-end latency of the measured frames released after the first
    `--warmup-s` seconds, from `apps/<app>.csv`."""
    rows = []
    for name in sorted(os.listdir(out)):
        m = re.fullmatch(r"(?:([abc])-)?(timeslice|mps|green|protected|cpu)-n(\d+)", name)
        run_dir = os.path.join(out, name, "run")
        if not m or not os.path.exists(os.path.join(run_dir, "summary.json")):
            continue
        with open(os.path.join(run_dir, "summary.json")) as f:
            apps = [x["name"] for x in json.load(f).get("apps", [])]
        for app in apps:
            frames_ = [r for r in frame_rows(os.path.join(run_dir, "apps", app + ".csv"))
                       if r["measured"] == "1" and float(r["release_ms"]) >= a.warmup_s * 1000]
            lat = sorted(float(r["latency_ms"]) for r in frames_ if r["latency_ms"])
            if not frames_:
                continue
            late = sum(1 for r in frames_ if r["timeout"] == "1")
            p = {q: percentile(lat, q) for q in (0.10, 0.90, 0.95, 0.99)}
            rows.append(dict(layout=m.group(1) or "one", mechanism=m.group(2),
                             apps=int(m.group(3)), app=app, frames=len(frames_),
                             completed=len(lat),
                             timeout_pct=100.0 * late / len(frames_),
                             max_ms=lat[-1] if lat else None, p99_ms=p[0.99],
                             tail_ms=lat[-1] - p[0.95] if lat else None,
                             flatness_ms=p[0.90] - p[0.10] if lat else None))
    return rows


def steady_markdown(a, rows):
    """The second table: the same comparison without the first `--warmup-s` seconds."""
    base_name = BASELINE_NAME[a.gpus]
    out = ["", f"## After the first {a.warmup_s:g} s", "",
           f"The same runs, frames released in the first {a.warmup_s:g} s left out as well (on "
           "the H100 a one-time stall in the first second, frames 10-35, set most runs' max "
           "latency in the table above: docs/apps.md). Worst app's max and p99, mean flatness "
           "and tail.", "",
           f"| apps | layout | mechanism | worst max ms | worst p99 ms | mean flatness ms "
           f"| mean tail ms | worst timeout % | max vs {base_name} | p99 vs {base_name} "
           f"| flatness vs {base_name} |",
           "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    agg = by_configuration(rows)

    def worst(rs, key):
        v = [r[key] for r in rs if r[key] is not None]
        return max(v) if v else None

    def mean(rs, key):
        v = [r[key] for r in rs if r[key] is not None]
        return statistics.mean(v) if v else None
    for (n, layout, mech), rs in sorted(agg.items()):
        base = agg.get(baseline(a, n, layout, mech))
        cuts = ["—"] * 3
        if base and base is not rs:
            cuts = [change(reduction(f(rs, k), f(base, k)))
                    for f, k in ((worst, "max_ms"), (worst, "p99_ms"), (mean, "flatness_ms"))]
        out.append(f"| {n} | {layout} | {mech} | {num(worst(rs, 'max_ms'), 1)} "
                   f"| {num(worst(rs, 'p99_ms'), 1)} | {num(mean(rs, 'flatness_ms'), 2)} "
                   f"| {num(mean(rs, 'tail_ms'), 2)} | {worst(rs, 'timeout_pct'):.2f} "
                   f"| {' | '.join(cuts)} |")
    return "\n".join(out) + "\n"


def protection_markdown(a, rows):
    """The protected runs against MPS alone at the same N, after the first `--warmup-s`
    seconds: app 1 (critical) and the best-effort apps."""
    agg = by_configuration(rows)
    plain = "cpu" if a.backend == "cpu" else "mps"
    pairs = [(n, agg.get((n, "one", plain)), rs) for (n, layout, mech), rs in sorted(agg.items())
             if mech == "protected"]
    if not pairs:
        return ""
    out = ["", "## Criticality protection (app 1 critical, the others best effort)", "",
           f"After the first {a.warmup_s:g} s. `{plain}`: the same partitions, nobody protected; "
           "`protected`: the guard and priorities on (docs/criticality.md, Apps). App 1's max, "
           "p99, flatness and timeouts; the other apps' frames that reached the sink (of those "
           "released) and their worst timeout %.", "",
           "| apps | run | app 1 max ms | app 1 p99 ms | app 1 flatness ms | app 1 timeout % "
           "| others completed % | others worst timeout % |",
           "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for n, base, prot in pairs:
        for label, rs in ((plain, base), ("protected", prot)):
            if not rs:
                continue
            first = [r for r in rs if r["app"].endswith("1")]
            others = [r for r in rs if not r["app"].endswith("1")]
            if not first:
                continue
            f1 = first[0]
            done = sum(r["completed"] for r in others)
            released = sum(r["frames"] for r in others)
            worst_other = max((r["timeout_pct"] for r in others), default=None)
            out.append(f"| {n} | {label} | {num(f1['max_ms'], 1)} | {num(f1['p99_ms'], 1)} "
                       f"| {num(f1['flatness_ms'], 2)} | {f1['timeout_pct']:.2f} "
                       f"| {num(100.0 * done / released if released else None, 1)} "
                       f"| {num(worst_other, 2)} |")
    return "\n".join(out) + "\n"


def by_configuration(rows):
    """The rows grouped by (number of apps, layout, mechanism)."""
    agg = {}
    for r in rows:
        agg.setdefault((r["apps"], r["layout"], r["mechanism"]), []).append(r)
    return agg


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


BASELINE_NAME = {1: "timeslice", 2: "layout b"}


def baseline(a, n, layout, mech):
    """The configuration a result is compared with: time-slicing on one GPU; layout b (the
    default multi-GPU set-up) under the same mechanism on two."""
    return (n, "b", mech) if a.gpus == 2 else (n, "one", "timeslice")


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
           f"| apps | layout | mechanism | worst max ms | mean flatness ms | mean tail ms "
           f"| worst timeout % | GPU util % (each GPU) | max latency vs {BASELINE_NAME[a.gpus]} "
           f"| flatness vs {BASELINE_NAME[a.gpus]} | GPU util vs {BASELINE_NAME[a.gpus]} |",
           "| ---: | --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |"]
    agg = by_configuration(rows)
    for (n, layout, mech), rs in sorted(agg.items()):
        worst, flat, tail = summarise(rs)
        miss = max(r["timeout_pct"] for r in rs)
        util = rs[0]["gpu_util_pct"]
        base = agg.get(baseline(a, n, layout, mech))
        cut_max = cut_flat = util_gain = None
        if base and base is not rs:
            b_worst, b_flat, _ = summarise(base)
            cut_max = reduction(worst, b_worst)
            cut_flat = reduction(flat, b_flat)
            b_util = base[0]["gpu_util_pct"]
            if util is not None and b_util:
                util_gain = -(util / b_util - 1.0)
        out.append(f"| {n} | {layout} | {mech} | {num(worst, 1)} | {num(flat, 2)} | "
                   f"{num(tail, 2)} | {miss:.2f} | {rs[0]['gpu_util_each']} | {change(cut_max)} "
                   f"| {change(cut_flat)} | {change(util_gain)} |")
    out += ["", f"Changes are written as changes of the value against {BASELINE_NAME[a.gpus]} "
            "with the same number of apps: −25 % is a 25 % cut. Paper 004: MPS partitions −21 to "
            "−30 % max latency and −17 to −25 % flatness against no partitions on one GPU; on two "
            "GPUs, compute and graphics split (c) −35 % max latency and +42 % GPU utilisation "
            "against the default multi-GPU set-up (b)."]
    return "\n".join(out) + "\n"


def collect(out):
    """The rows of every run under `out`, this call's and earlier ones' (a study split over
    several device calls writes one table)."""
    rows = []
    for name in sorted(os.listdir(out)):
        m = re.fullmatch(r"(?:([abc])-)?(timeslice|mps|green|protected|cpu)-n(\d+)", name)
        path = os.path.join(out, name, "run", "summary.json")
        if not m or not os.path.exists(path):
            continue
        try:
            with open(path) as f:
                rows += rows_of(json.load(f), m.group(1) or "one", m.group(2), int(m.group(3)))
        except (OSError, ValueError, KeyError) as e:
            sys.stderr.write(f"{path}: left out ({e})\n")
    return rows


def main():
    a = parse_args()
    exe = binary(a)
    os.makedirs(a.out, exist_ok=True)
    failed = []
    for n in [] if a.table_only else a.apps:
        for layout in a.layouts:
            for mech in a.mechanisms:
                if mech == "protected" and n < 2:
                    continue  # one app: nothing to protect it from
                name = f"{mech}-n{n}" if layout == "one" else f"{layout}-{mech}-n{n}"
                text = scenario(a, mech, n, layout)
                if run(exe, os.path.join(a.out, name), text, a.duration + a.run_slack) is None:
                    failed.append(name)
    rows = collect(a.out)
    if rows:
        with open(os.path.join(a.out, "apps-study.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
            w.writeheader()
            w.writerows(rows)
        steady = steady_rows(a.out, a)
        md = markdown(a, rows) + steady_markdown(a, steady) + protection_markdown(a, steady)
        with open(os.path.join(a.out, "apps-study.md"), "w") as f:
            f.write(md)
        print(md)
    if failed:
        print("failed runs: " + ", ".join(failed), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
