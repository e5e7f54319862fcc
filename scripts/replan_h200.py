#!/usr/bin/env python3
"""Issue 35's measurement: a served best-effort model's load triples and falls, served three ways.

    python3 scripts/replan_h200.py --isolane ISOLANE --scenario scenarios/serve/h200-replan.toml \
        --out DIR [--modes fixed,manual,autoplan] [--base-s 6] [--high-s 20] [--after-s 15] \
        [--profile-cache DIR] [--grow resnet50=50] [--shrink resnet50=30] [--reload resnet50]

For each mode it starts `isolane serve` on the scenario and sends every model requests at its
scenario rate (HTTP, binary tensor data, one row each, open loop from a few threads per model),
except --surge's model, whose rate is three times its own from --base-s for --high-s seconds,
then its own again for --after-s. The modes:

  fixed     the scenario's shares throughout;
  manual    `isolane ctl resize` at the two load changes (--grow when the load triples, --shrink
            when it falls), then `isolane ctl load` of --reload's model halfway through the
            last phase: a loaded model rebuilt in its partition (a reload), whose pause is a
            rebuilt model's;
  autoplan  `isolane serve --autoplan --autoplan-dwell 3 --profile-cache DIR` (the profiles that
            `isolane plan --auto` measured there first). The last phase is long enough (15 s)
            for the 10 s rate window to see the fall and the loop to shrink back.

Per mode and model: requests sent, answered, refused (429/503, counted by reason), failed (any
other error: a lost request would be one), late (answered with `late = true`), the p50/p99/max
of the answered ones' client latency, and for the critical model whether it kept the issue's
<= 0.1 % late with none lost; and each resize or reload (from the server's access log, with its
time to serve and its pause, and for autoplan the decisions of autoplan.csv). DIR gets summary.md, summary.json and
each mode's server log, autoplan.csv and requests CSV.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

SENDERS = 4  # threads per model: a request's answer takes one model job, a few ms


def start_server(isolane, scenario, extra, log_path):
    server = subprocess.Popen(
        [isolane, "serve", scenario, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", *extra],
        stdout=subprocess.PIPE, stderr=open(log_path, "w"), text=True, start_new_session=True)
    ready = server.stdout.readline()
    if not ready.startswith("isolane serve: ready"):
        server.wait(timeout=60)
        raise RuntimeError(f"not ready: {ready!r}; {open(log_path).read()[-3000:]}")
    return server, ready.split("HTTP on ")[1].split(",")[0]


def stop_server(server):
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def scenario_rates(path):
    """Each workload's name and rate_hz, read from the TOML (Python 3.11's tomllib)."""
    import tomllib
    with open(path, "rb") as f:
        s = tomllib.load(f)
    return {w["name"]: float(w["rate_hz"]) for w in s["workload"]}


def scenario_mechanism(path):
    """[device] mechanism of the scenario (mps, green, ...)."""
    import tomllib
    with open(path, "rb") as f:
        return tomllib.load(f).get("device", {}).get("mechanism", "mps")


# The `ctl resize` key of a partition, and the manual mode's default grow and shrink (the
# surge model's size when its load triples and when it falls), per mechanism.
RESIZE = {"mps": ("thread_pct", "resnet50=50", "resnet50=30"),
          "green": ("sms", "resnet50=56", "resnet50=40")}


def refusal_kind(message):
    """A refusal's reason, from its message (crates/isolane-serve/src/request.rs, Refusal)."""
    if "after its deadline" in message:
        return "predicted late"
    if "queue is full" in message:
        return "queue full"
    if "unloaded" in message or "not ready" in message:
        return "unloaded"
    if "shutting down" in message:
        return "draining"
    return "other"


def number_after(message, words):
    m = re.search(r"([0-9.]+) ms " + words, message)
    return float(m.group(1)) if m else None


def sender(addr, model, rate_of, t0, until, records, lock):
    """Sends `model` requests at rate_of(t) / SENDERS a second until `until` (open loop: a late
    answer delays the next send, never drops it)."""
    client = httpclient.InferenceServerClient(addr, connection_timeout=120, network_timeout=120)
    meta = client.get_model_metadata(model)
    shape = [1] + [int(d) for d in meta["inputs"][0]["shape"][1:]]
    x = np.random.default_rng(hash(model) & 0xFFFF).standard_normal(shape).astype(np.float32)
    inp = httpclient.InferInput(meta["inputs"][0]["name"], shape, "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    outs = [httpclient.InferRequestedOutput(meta["outputs"][0]["name"], binary_data=True)]
    nxt = time.monotonic()
    mine = []
    while True:
        now = time.monotonic()
        if now >= until:
            break
        if nxt > now:
            time.sleep(nxt - now)
        sent = time.monotonic()
        try:
            r = client.infer(model, [inp], outputs=outs)
            late = bool((r.get_response().get("parameters") or {}).get("late", False))
            mine.append((sent - t0, (time.monotonic() - sent) * 1e3, "late" if late else "ok", ""))
        except InferenceServerException as e:
            status = str(e.status() or "")
            kind = "refused" if status in ("429", "503") else f"failed {status}"
            mine.append((sent - t0, (time.monotonic() - sent) * 1e3, kind, e.message() or ""))
        except Exception as e:  # a connection lost, a timeout: counted as failed, never hidden
            mine.append((sent - t0, (time.monotonic() - sent) * 1e3, f"failed {type(e).__name__}",
                         str(e)[:200]))
        nxt += SENDERS / rate_of(sent - t0)
    client.close()
    with lock:
        records.extend((model, *r) for r in mine)


def pct(v, q):
    if not v:
        return None
    v = sorted(v)
    return v[min(len(v) - 1, max(0, int(np.ceil(q / 100 * len(v))) - 1))]


def resizes_from_log(log_path):
    """The server's control lines of resizes and reloads: kind, model, what, to serving and
    pause (ms)."""
    def field(line, key):
        m = re.search(key + r'=(?:"([^"]*)"|(\S+))', line)
        return None if m is None else (m.group(1) if m.group(1) is not None else m.group(2))

    def ms(v):
        return int(v) / 1e3 if v is not None and v.isdigit() else None

    out = []
    for line in open(log_path, errors="replace"):
        kind = field(line, "change")
        if 'protocol="control"' in line and kind in ("resize", "reload"):
            out.append({"kind": kind, "model": field(line, "model"), "what": field(line, "what"),
                        "took_ms": ms(field(line, "took_us")),
                        "pause_ms": ms(field(line, "pause_us"))})
    return out


def run_mode(a, mode, rates, workdir):
    log = os.path.join(workdir, f"{mode}-serve.log")
    extra = []
    out_dir = os.path.join(workdir, f"{mode}-out")
    if mode == "autoplan":
        extra = ["--autoplan", "--autoplan-dwell", str(a.dwell), "--profile-cache", a.profile_cache,
                 "--out", out_dir, "--force"]
    server, addr = start_server(a.isolane, a.scenario, extra, log)
    records, lock, events = [], threading.Lock(), []
    try:
        t0 = time.monotonic()
        end = a.base_s + a.high_s + a.after_s
        surge = a.surge

        def rate_of(model):
            base = rates[model]
            if model != surge:
                return lambda t: base
            return lambda t: base * 3 if a.base_s <= t < a.base_s + a.high_s else base

        threads = [threading.Thread(target=sender,
                                    args=(addr, m, rate_of(m), t0, t0 + end, records, lock))
                   for m in rates for _ in range(SENDERS)]
        for t in threads:
            t.start()
        if mode == "manual":
            changes = [(a.base_s, ["resize", *a.grow.split("=")]),
                       (a.base_s + a.high_s, ["resize", *a.shrink.split("=")])]
            if a.reload:
                changes.append((a.base_s + a.high_s + a.after_s / 2, ["load", a.reload]))
            for at, change in changes:
                time.sleep(max(0.0, t0 + at - time.monotonic()))
                cmd = [a.isolane, "ctl", "--server", addr, "--json", change[0], change[1]]
                if change[0] == "resize":
                    cmd.append(f"{a.resize_key}={change[2]}")
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
                events.append({"t_s": round(time.monotonic() - t0, 3), "rc": r.returncode,
                               "reply": (r.stdout or r.stderr).strip()})
        for t in threads:
            t.join()
    finally:
        stop_server(server)
    with open(os.path.join(workdir, f"{mode}-requests.csv"), "w") as f:
        f.write("model,t_s,latency_ms,outcome,why\n")
        for r in sorted(records, key=lambda r: r[1]):
            why = r[4].replace('"', "'")
            f.write(f'{r[0]},{r[1]:.4f},{r[2]:.3f},{r[3]},"{why}"\n')
    per_model = {}
    for m in rates:
        mine = [r for r in records if r[0] == m]
        answered = [r[2] for r in mine if r[3] in ("ok", "late")]
        per_model[m] = {
            "sent": len(mine), "answered": len(answered),
            "late": sum(r[3] == "late" for r in mine),
            "refused": sum(r[3] == "refused" for r in mine),
            "failed": sum(r[3].startswith("failed") for r in mine),
            "p50_ms": pct(answered, 50), "p99_ms": pct(answered, 99),
            "max_ms": max(answered) if answered else None,
            "refusals": refusals([r for r in mine if r[3] == "refused"]),
        }
    decisions = []
    csv = os.path.join(out_dir, "autoplan.csv")
    if os.path.exists(csv):
        decisions = open(csv).read().splitlines()[1:]
    return {"models": per_model, "resizes": resizes_from_log(log), "ctl": events,
            "decisions": decisions, "exit": server.returncode}


def refusals(refused):
    """Per reason: how many, from when to when (s), and for those predicted late the service
    time per job admission predicted with and the predicted lateness (ms, median and max)."""
    out = {}
    for r in refused:
        kind = refusal_kind(r[4])
        k = out.setdefault(kind, {"n": 0, "first_s": r[1], "last_s": r[1], "service_ms": [],
                                  "lateness_ms": []})
        k["n"] += 1
        k["first_s"] = min(k["first_s"], r[1])
        k["last_s"] = max(k["last_s"], r[1])
        for key, words in (("service_ms", "per job"), ("lateness_ms", "after its deadline")):
            v = number_after(r[4], words)
            if v is not None:
                k[key].append(v)
    for k in out.values():
        for key in ("service_ms", "lateness_ms"):
            v = k.pop(key)
            k[key] = {"p50": pct(v, 50), "max": max(v)} if v else None
    return out


def fmt(v, d=3):
    return "–" if v is None else (f"{v:.{d}f}" if isinstance(v, float) else str(v))


def summary_md(a, results):
    L = ["# Re-planning while serving on the H200 (issue 35)", "",
         f"`{a.scenario}`; `{a.surge}`'s request rate ×3 from {a.base_s} s for {a.high_s} s, then "
         f"back for {a.after_s} s; manual: `ctl resize` {a.grow} then {a.shrink}"
         + (f", then `ctl load {a.reload}` (a reload)" if a.reload else "")
         + f"; autoplan: dwell {a.dwell} s. Client latency over HTTP (binary data), one row per "
         "request. Lost: a request neither answered nor refused (failed).", "",
         "| mode | model | sent | answered | late | late % | refused | failed | p50 ms | p99 ms | max ms |",
         "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for mode, r in results.items():
        if "error" in r:
            L.append(f"| {mode} | error: {r['error']} |" + " |" * 9)
            continue
        for m, s in r["models"].items():
            late_pct = 100.0 * s["late"] / s["answered"] if s["answered"] else None
            L.append(f"| {mode} | {m} | {s['sent']} | {s['answered']} | {s['late']} | "
                     f"{fmt(late_pct, 2)} | {s['refused']} | {s['failed']} | {fmt(s['p50_ms'])} | "
                     f"{fmt(s['p99_ms'])} | {fmt(s['max_ms'])} |")
    L += ["", f"## The critical model ({a.critical}): at most 0.1 % late, none lost", "",
          "| mode | late % | refused | lost | held |", "| --- | ---: | ---: | ---: | --- |"]
    for mode, r in results.items():
        s = r.get("models", {}).get(a.critical)
        if s is None:
            continue
        late_pct = 100.0 * s["late"] / s["answered"] if s["answered"] else None
        held = late_pct is not None and late_pct <= 0.1 and s["failed"] == 0
        L.append(f"| {mode} | {fmt(late_pct, 2)} | {s['refused']} | {s['failed']} | "
                 f"{'yes' if held else 'no'} |")
    fixed = results.get("fixed", {}).get("models", {})
    auto = results.get("autoplan", {}).get("models", {})
    best_effort = [m for m in auto if m != a.critical and m in fixed]
    if best_effort:
        # Work-conserving re-plans (session 21): autoplan should give best effort at least the
        # fixed partitions' service, so its p99 should not be far past the fixed run's.
        L += ["", "## Best effort: autoplan against the fixed partitions", "",
              "| model | fixed p99 ms | autoplan p99 ms | autoplan / fixed |",
              "| --- | ---: | ---: | ---: |"]
        for m in best_effort:
            f99, a99 = fixed[m]["p99_ms"], auto[m]["p99_ms"]
            ratio = a99 / f99 if f99 and a99 is not None else None
            L.append(f"| {m} | {fmt(f99)} | {fmt(a99)} | {fmt(ratio, 2)} |")
    L += ["", "## Why requests were refused", "",
          "Admission refuses a request predicted to complete after its deadline (queued ahead "
          "plus the service time per job it predicts with, the p90 of the model's recent jobs).",
          "", "| mode | model | reason | refused | from s | to s | service ms p50 / max | "
          "predicted lateness ms p50 / max |", "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for mode, r in results.items():
        for m, s in r.get("models", {}).items():
            for kind, k in s.get("refusals", {}).items():
                sv, lt = k.get("service_ms"), k.get("lateness_ms")
                L.append(f"| {mode} | {m} | {kind} | {k['n']} | {k['first_s']:.1f} | "
                         f"{k['last_s']:.1f} | "
                         + (f"{fmt(sv['p50'])} / {fmt(sv['max'])}" if sv else "–") + " | "
                         + (f"{fmt(lt['p50'])} / {fmt(lt['max'])}" if lt else "–") + " |")
    L += ["", "## Resizes and reloads (the server's access log)", "",
          "| mode | change | model | what | to serving ms | pause ms |",
          "| --- | --- | --- | --- | ---: | ---: |"]
    for mode, r in results.items():
        for z in r.get("resizes", []):
            L.append(f"| {mode} | {z.get('kind', 'resize')} | {z['model']} | {z['what'] or ''} | "
                     f"{fmt(z['took_ms'], 1)} | {fmt(z['pause_ms'])} |")
    for mode, r in results.items():
        if r.get("decisions"):
            L += ["", f"## {mode}: decisions (autoplan.csv)", "", "```text", *r["decisions"], "```"]
        if r.get("ctl"):
            L += ["", f"## {mode}: ctl replies", "", "```text",
                  *[json.dumps(e) for e in r["ctl"]], "```"]
    return "\n".join(L) + "\n"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--isolane", required=True)
    p.add_argument("--scenario", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--modes", default="fixed,manual,autoplan")
    p.add_argument("--surge", default="resnet50")
    p.add_argument("--base-s", type=float, default=6.0)
    p.add_argument("--high-s", type=float, default=20.0)
    p.add_argument("--after-s", type=float, default=15.0)
    p.add_argument("--dwell", type=float, default=3.0)
    p.add_argument("--grow", default=None,
                   help="manual mode: MODEL=SIZE when the load triples (thread % under MPS, SMs "
                        "for green contexts; default by the scenario's mechanism)")
    p.add_argument("--shrink", default=None, help="manual mode: MODEL=SIZE when it falls")
    p.add_argument("--reload", default="resnet50",
                   help="manual mode: this model is reloaded (rebuilt in its partition); '' for none")
    p.add_argument("--critical", default="mobilenet_v2")
    p.add_argument("--profile-cache", default=os.path.expanduser("~/.cache/isolane/profiles"))
    a = p.parse_args()
    mechanism = scenario_mechanism(a.scenario)
    if mechanism not in RESIZE:
        print(f"replan: {a.scenario}: mechanism {mechanism!r}; this driver resizes "
              f"{', '.join(RESIZE)} partitions", file=sys.stderr)
        return 2
    a.resize_key, grow, shrink = RESIZE[mechanism]
    a.grow = a.grow or grow
    a.shrink = a.shrink or shrink
    os.makedirs(a.out, exist_ok=True)
    rates = scenario_rates(a.scenario)
    results = {}
    for mode in a.modes.split(","):
        print(f"replan: {mode}", flush=True)
        try:
            results[mode] = run_mode(a, mode, rates, a.out)
        except Exception as e:
            results[mode] = {"error": str(e)[:500]}
        print(json.dumps(results[mode])[:2000], flush=True)
        # After each mode, so that a run cut short by its time limit still says what it did.
        with open(os.path.join(a.out, "summary.json"), "w") as f:
            json.dump(results, f, indent=1)
        with open(os.path.join(a.out, "summary.md"), "w") as f:
            f.write(summary_md(a, results))
    print(open(os.path.join(a.out, "summary.md")).read())
    lost = any(s["failed"] for r in results.values() for s in r.get("models", {}).values())
    return 1 if lost or any("error" in r for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
