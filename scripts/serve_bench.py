#!/usr/bin/env python3
"""Measures `isolane serve` (issue 32): what serving adds per request against the same model
run in-process, the critical model's tail while best-effort models are flooded, and refusals
of deadlines below what a model can do. scripts/serve-bench.sh stages and runs it (usage
there); it also runs as is on the CPU against scenarios/serve/cpu-spin.toml.

  serve_bench.py --isolane BIN --scenario S.toml --out DIR [--perf-analyzer PA] [--quick]

Steps, in this order (each with its own time limit; the server is always stopped at the end):
  inproc    each probe model (critical, batch 1) alone in-process in its own partition size:
            `isolane run` of a one-workload copy of the scenario at rate "max" (and, on
            cuda, `isolane bench` on the whole GPU for reference)
  serve     `isolane serve S` on free ports, waited for until its ready line
  overhead  each probe model at batch 1: perf_analyzer over gRPC and HTTP (binary data), gRPC
            with system shared memory and gRPC streaming (ModelStreamInfer, perf_analyzer's
            --streaming), at each of --concurrencies (1, 2, 4, 8): the best
            throughput against in-process with the concurrency it took and its p50/p99; the
            server's stages at concurrency 1; tritonclient from Python at concurrency 1. Then,
            once the main server has stopped, a server of the probes alone per --ab-spin-us
            value ([timing] spin_us set to it), at concurrency 1: the spin A/B
  critical  the critical model at --critical-rate Hz (gRPC, its scenario deadline) alone,
            then while every best-effort model is flooded (perf_analyzer, or Python threads
            without it) at --flood-concurrency requests in flight
  floor     after the main server: the protocol floor, a model that does almost nothing (a
            GlobalAveragePool of the probe's input shape, an ONNX file this script writes) served
            beside the probe by a server of the two alone with the scenario's settings: both at
            concurrency 1 over gRPC, HTTP and gRPC with system shared memory, and the floor
            in-process (`isolane run` at rate "max"). What a request adds at p50 then splits into
            the floor's (client, socket and server plumbing for the same body) and what the
            model's path adds above it
  deadline  (a) full-batch requests to the slowest model with a deadline half its measured
            latency; (b) a burst of --burst requests at once to the critical model with a
            deadline of twice its latency: refused up front (429 / RESOURCE_EXHAUSTED),
            none answered late
Writes DIR/summary.json and DIR/summary.md, and logs and CSVs beside them.
"""

import argparse
import glob
import json
import math
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import tomllib
import urllib.request

import numpy as np

try:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException
except ImportError as e:  # said once, plainly, rather than as a traceback
    sys.exit(f"serve_bench: tritonclient is not importable ({e}); serve-bench.sh run installs it")

SUMMARY = {"steps": {}, "errors": []}
OUT = "."
BEGAN = time.time()


def time_left(args, need_s, what):
    """Whether `need_s` more seconds fit in --budget-s; what is left out for lack of them is said
    in the summary (a step cut by its caller's time limit would lose everything instead)."""
    if time.time() - BEGAN + need_s <= args.budget_s:
        return True
    SUMMARY.setdefault("left_out", []).append(f"{what} (--budget-s {args.budget_s:.0f})")
    log(f"left out for time: {what}")
    return False


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def error(step, msg):
    log(f"{step}: ERROR {msg}")
    SUMMARY["errors"].append(f"{step}: {msg}")


def pct(sorted_values, q):
    """The q-th percentile (nearest rank) of sorted values, or None."""
    if not sorted_values:
        return None
    i = min(len(sorted_values) - 1, max(0, math.ceil(q / 100 * len(sorted_values)) - 1))
    return sorted_values[i]


def lat_stats(lat_s):
    """p50/p99/max in ms of a list of seconds."""
    s = sorted(lat_s)
    f = lambda v: None if v is None else round(v * 1e3, 4)  # noqa: E731
    return {"n": len(s), "p50_ms": f(pct(s, 50)), "p99_ms": f(pct(s, 99)), "max_ms": f(s[-1] if s else None)}


def run_logged(cmd, timeout, name, env=None):
    """Runs cmd with a time limit, output to OUT/name.log; returns (rc, output)."""
    path = os.path.join(OUT, f"{name}.log")
    log(f"$ {' '.join(cmd)}  (limit {timeout:.0f} s)")
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout,
                           text=True, env=env, start_new_session=True)
        out, rc = p.stdout, p.returncode
    except subprocess.TimeoutExpired as e:
        out = (e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or "") + f"\n(timed out after {timeout} s)\n"
        rc = 124
    with open(path, "w") as f:
        f.write(" ".join(cmd) + "\n" + out)
    return rc, out


# ---------------------------------------------------------------------------------------------
# The scenario


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise ValueError(f"cannot write {v!r} as TOML")


def alone_scenario(scenario, w, seconds, rate_hz="max"):
    """A copy of the scenario with workload w alone, in-process, closed loop (or at `rate_hz`),
    no deadline."""
    lines = []
    for table in ("device", "timing"):
        if table in scenario:
            lines.append(f"[{table}]")
            lines += [f"{k} = {toml_value(v)}" for k, v in scenario[table].items()]
    lines.append("[[workload]]")
    keep = {k: v for k, v in w.items() if k not in ("serve", "rate_hz", "deadline_ms", "duration_s", "jobs", "late")}
    keep.update({"rate_hz": rate_hz, "duration_s": seconds})
    lines += [f"{k} = {toml_value(v)}" for k, v in keep.items()]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# The server


class Server:
    """`isolane serve` in its own process group; stop() always ends it."""

    def __init__(self, args, has_grpc, scenario=None, name="server"):
        self.args = args
        self.scenario = scenario or args.scenario
        self.name = name
        self.has_grpc = has_grpc
        self.proc = None
        self.http = self.grpc = None
        self.stopped = None

    def start(self, timeout):
        cmd = [self.args.isolane, "serve", self.scenario, "--http", "127.0.0.1:0", "--no-access-log"]
        if self.has_grpc:
            cmd += ["--grpc", "127.0.0.1:0"]
        if self.args.backend:
            cmd += ["--backend", self.args.backend]
        log(f"$ {' '.join(cmd)}")
        self.err = open(os.path.join(OUT, f"{self.name}.log"), "w")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.err, text=True, start_new_session=True)
        with open(os.path.join(OUT, f"{self.name}.pid"), "w") as f:
            f.write(str(self.proc.pid))
        ready = []

        def read():
            for line in self.proc.stdout:
                with open(os.path.join(OUT, f"{self.name}.out"), "a") as f:
                    f.write(line)
                if "ready" in line and not ready:
                    ready.append(line.strip())

        threading.Thread(target=read, daemon=True).start()
        end = time.time() + timeout
        while not ready and time.time() < end and self.proc.poll() is None:
            time.sleep(0.05)
        if not ready:
            rc = self.proc.poll()
            self.stop()
            raise RuntimeError(f"no ready line within {timeout} s (exit {rc}); see {self.name}.log")
        line = ready[0]
        log(line)
        m = re.search(r"HTTP on ([^\s;,]+)", line)
        g = re.search(r"gRPC on ([^\s;,]+)", line)
        if not m:
            self.stop()
            raise RuntimeError(f"no HTTP address in the ready line: {line}")
        self.http = m.group(1)
        self.grpc = g.group(1) if g else None
        if self.name == "server":
            SUMMARY["server"] = {"ready_line": line, "http": self.http, "grpc": self.grpc}
        return line

    def stop(self, drain_timeout=40):
        if self.proc is None or self.stopped is not None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(drain_timeout)
            except subprocess.TimeoutExpired:
                error("server", f"still running {drain_timeout} s after SIGTERM: killed")
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(10)
        self.stopped = self.proc.returncode
        if self.name == "server":
            SUMMARY.setdefault("server", {})["exit_code"] = self.stopped
        log(f"{self.name} stopped: exit {self.stopped}")

    def metrics(self):
        with urllib.request.urlopen(f"http://{self.http}/metrics", timeout=10) as r:
            return parse_metrics(r.read().decode())


def stage_totals(http, model):
    """The server's own stage breakdown of `model` so far (the statistics extension's
    `isolane_stages`): {(protocol, stage): (count, ns)}; empty from a server without it."""
    try:
        with urllib.request.urlopen(f"http://{http}/v2/models/{model}/stats", timeout=10) as r:
            stats = json.loads(r.read().decode())["model_stats"][0]
    except Exception as e:  # noqa: BLE001 - a missing breakdown is reported, not fatal
        log(f"stage breakdown of {model}: {e}")
        return {}
    return {(t["protocol"], t["stage"]): (t["count"], t["ns"]) for t in stats.get("isolane_stages", [])}


def stage_means(before, after, proto):
    """Mean µs per stage of `proto`'s requests answered between two `stage_totals`, in the
    server's order, and their sum (the server's span)."""
    out = {}
    for (p, stage), (count, ns) in after.items():
        if p != proto:
            continue
        c0, ns0 = before.get((p, stage), (0, 0))
        if count > c0:
            out[stage] = round((ns - ns0) / (count - c0) / 1e3, 1)
    if out:
        out["server"] = round(sum(out.values()), 1)
    return out


def parse_metrics(text):
    """{(name, frozenset(labels)): value} of a Prometheus/OpenMetrics exposition."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)", line)
        if not m:
            continue
        labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        try:
            out[(m.group(1), labels)] = float(m.group(4))
        except ValueError:
            pass
    return out


def model_figures(before, after, model):
    """What /metrics says happened to `model` between two scrapes."""
    def delta(name, **want):
        total = 0.0
        for (n, labels), v in after.items():
            d = dict(labels)
            if n == name and d.get("model") == model and all(d.get(k) == x for k, x in want.items()):
                total += v - before.get((n, labels), 0.0)
        return total

    rejections = {}
    for (n, labels), v in after.items():
        d = dict(labels)
        if n == "isolane_serve_rejections_total" and d.get("model") == model:
            k = v - before.get((n, labels), 0.0)
            if k:
                rejections[d.get("reason", "?")] = int(k)
    # The latency histogram's p99 (bucket upper bound) over the interval.
    buckets = []
    for (n, labels), v in after.items():
        d = dict(labels)
        if n == "isolane_serve_latency_seconds_bucket" and d.get("model") == model:
            le = float("inf") if d["le"] == "+Inf" else float(d["le"])
            buckets.append((le, v - before.get((n, labels), 0.0)))
    buckets.sort()
    p99 = None
    if buckets and buckets[-1][1] > 0:
        for le, c in buckets:
            if c >= 0.99 * buckets[-1][1]:
                p99 = le
                break
    lat_n = delta("isolane_serve_latency_seconds_count")
    lat_mean = round(delta("isolane_serve_latency_seconds_sum") / lat_n * 1e3, 4) if lat_n else None
    rows = delta("isolane_serve_job_rows_sum")
    jobs = delta("isolane_serve_job_rows_count")
    return {
        "requests": int(delta("isolane_serve_requests_total")),
        "late": int(delta("isolane_serve_late_total")),
        "rejections": rejections,
        "jobs": int(jobs),
        "rows": int(rows),
        "mean_rows_per_job": round(rows / jobs, 2) if jobs else None,
        "latency_mean_ms": lat_mean,
        "latency_p99_bucket_ms": None if p99 is None else (p99 * 1e3 if p99 != float("inf") else "inf"),
        "guard_held_s": round(delta("isolane_serve_guard_held_seconds_total"), 4),
    }


# ---------------------------------------------------------------------------------------------
# Clients


class Client:
    """One tritonclient (gRPC or HTTP, binary tensors) for one model; not shared by threads.
    `grpc-stream`: gRPC with every request of this client on one stream (start_stream,
    async_stream_infer), each waited for before the next is sent."""

    def __init__(self, proto, url, model, meta):
        self.proto, self.model, self.meta = proto, model, meta
        self.stream = proto == "grpc-stream"
        self.grpc = proto in ("grpc", "grpc-stream")
        mod = grpcclient if self.grpc else httpclient
        self.mod = mod
        if self.grpc:
            self.c = mod.InferenceServerClient(url=url)
        else:
            self.c = mod.InferenceServerClient(url=url, connection_timeout=10.0, network_timeout=10.0)
        self.broken = None
        if self.stream:
            self.answers = queue.Queue()
            self.c.start_stream(callback=lambda result, error: self.answers.put((result, error)))

    def infer(self, data, deadline_ms=None):
        """One request: ("ok"|"refused"|"error", seconds, late, message)."""
        inp = self.mod.InferInput(self.meta["input"], list(data.shape), "FP32")
        if self.broken:
            return "error", 0.0, False, self.broken
        if self.grpc:
            inp.set_data_from_numpy(data)
            outs = [self.mod.InferRequestedOutput(self.meta["output"])]
        else:
            inp.set_data_from_numpy(data, binary_data=True)
            outs = [self.mod.InferRequestedOutput(self.meta["output"], binary_data=True)]
        params = {"deadline_ms": int(deadline_ms)} if deadline_ms is not None else None
        t0 = time.perf_counter()
        try:
            if self.stream:
                self.c.async_stream_infer(self.model, [inp], outputs=outs, parameters=params)
                try:
                    r, err = self.answers.get(timeout=10.0)
                except queue.Empty:
                    # A late answer would be taken for the next request's: no more on this stream.
                    self.broken = "no answer on the stream within 10 s"
                    return "error", time.perf_counter() - t0, False, self.broken
                if err is not None:
                    # A stream's error carries the server's words only, no status code.
                    msg = err.message()
                    kind = "refused" if "refused" in msg else "error"
                    return kind, time.perf_counter() - t0, False, f"stream: {msg}"
            elif self.grpc:
                r = self.c.infer(self.model, [inp], outputs=outs, parameters=params, client_timeout=10.0)
            else:
                r = self.c.infer(self.model, [inp], outputs=outs, parameters=params)
        except InferenceServerException as e:
            dt = time.perf_counter() - t0
            status = str(e.status())
            kind = "refused" if status in ("429", "StatusCode.RESOURCE_EXHAUSTED") else "error"
            return kind, dt, False, f"{status}: {e.message()}"
        except Exception as e:  # a client-side time-out or a broken connection
            return "error", time.perf_counter() - t0, False, f"{type(e).__name__}: {e}"
        dt = time.perf_counter() - t0
        resp = r.get_response()
        if self.grpc:
            late = "late" in resp.parameters and resp.parameters["late"].bool_param
        else:
            late = bool((resp.get("parameters") or {}).get("late", False))
        return "ok", dt, late, ""

    def close(self):
        try:
            if self.stream:
                self.c.stop_stream()
            self.c.close()
        except Exception:
            pass


def model_meta(http_url, name):
    c = httpclient.InferenceServerClient(url=http_url)
    cfg = c.get_model_config(name)
    md = c.get_model_metadata(name)
    c.close()
    return {
        "input": md["inputs"][0]["name"],
        "output": md["outputs"][0]["name"],
        "dims": [int(d) for d in md["inputs"][0]["shape"][1:]],
        "output_dims": [int(d) for d in md["outputs"][0]["shape"][1:]],
        "max_batch": int(cfg.get("max_batch_size", 1)) or 1,
    }


def data_for(meta, rows, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal([rows] + meta["dims"]).astype(np.float32)


def sequential(client, data, n, deadline_ms=None):
    """n requests one after another: counts and latencies of the answered ones."""
    lat, counts, late, msgs = [], {"ok": 0, "refused": 0, "error": 0}, 0, []
    errors_in_a_row = 0
    for _ in range(n):
        kind, dt, is_late, msg = client.infer(data, deadline_ms)
        counts[kind] += 1
        # A model that does not answer (each error may be a 10 s time-out) is not asked on.
        errors_in_a_row = errors_in_a_row + 1 if kind == "error" else 0
        if errors_in_a_row == 3:
            msgs.append(msg)
            break
        if kind == "ok":
            lat.append(dt)
            late += is_late
        elif len(msgs) < 3:
            msgs.append(msg)
    return {**counts, "late": late, **lat_stats(lat), "messages": msgs}


def paced(client, data, rate_hz, seconds, deadline_ms=None):
    """Requests released every 1/rate_hz s (the next at once when one took longer)."""
    lat, counts, late, msgs = [], {"ok": 0, "refused": 0, "error": 0}, 0, []
    period = 1.0 / rate_hz
    t0 = time.perf_counter()
    k = 0
    while True:
        release = t0 + k * period
        now = time.perf_counter()
        if release - t0 >= seconds:
            break
        if release > now:
            time.sleep(release - now)
        kind, dt, is_late, msg = client.infer(data, deadline_ms)
        counts[kind] += 1
        if kind == "ok":
            lat.append(dt)
            late += is_late
        elif len(msgs) < 3:
            msgs.append(msg)
        k += 1
        if counts["error"] >= 3 and counts["error"] > counts["ok"]:
            msgs.append("stopped: more errors than answers")
            break
    return {**counts, "late": late, **lat_stats(lat), "messages": msgs}


def burst(proto, url, model, meta, n, rounds, deadline_ms):
    """rounds of n requests sent at once (n threads, each with its own client: tritonclient's
    HTTP client may not change threads), each with deadline_ms."""
    counts = {"ok": 0, "refused": 0, "error": 0, "late": 0}
    lat, msgs, lock = [], [], threading.Lock()
    data = data_for(meta, 1, seed=4)
    start, end = threading.Barrier(n + 1), threading.Barrier(n + 1)

    def worker():
        c = Client(proto, url, model, meta)
        try:
            for _ in range(rounds):
                start.wait(30)
                kind, dt, late, msg = c.infer(data, deadline_ms)
                with lock:
                    counts[kind] += 1
                    counts["late"] += late
                    if kind == "ok":
                        lat.append(dt)
                    elif len(msgs) < 3:
                        msgs.append(msg)
                end.wait(60)
        except threading.BrokenBarrierError:
            pass
        finally:
            c.close()

    ts = [threading.Thread(target=worker, daemon=True) for _ in range(n)]
    for t in ts:
        t.start()
    broken = False
    for _ in range(rounds):
        try:
            start.wait(30)
            end.wait(60)
        except threading.BrokenBarrierError:
            broken = True
            break
        time.sleep(0.05)
    if broken:
        start.abort()
        end.abort()
        error("deadline", f"a burst to {model} over {proto} did not complete its rounds in time")
    until = time.time() + 30
    for t in ts:
        t.join(max(0.1, until - time.time()))
    return {**counts, **lat_stats(lat), "messages": msgs}


def python_flood(url, model, meta, rows, concurrency, stop, result):
    """concurrency gRPC threads sending rows-row requests to model until stop is set."""
    data = data_for(meta, rows, seed=3)
    counts = {"ok": 0, "refused": 0, "error": 0}
    lock = threading.Lock()

    def worker():
        c = Client("grpc", url, model, meta)
        while not stop.is_set():
            kind = c.infer(data)[0]
            with lock:
                counts[kind] += 1
        c.close()

    ts = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    result.update(counts)


# ---------------------------------------------------------------------------------------------
# perf_analyzer


def perf_analyzer(args, proto, url, model, batch, concurrency, name, warmup=200, timeout=150, extra=()):
    """One perf_analyzer run; its CSV row as {column: value} (latencies in µs), or None."""
    if not args.perf_analyzer:
        return None
    csv = os.path.join(OUT, f"{name}.csv")
    cmd = [args.perf_analyzer, "-m", model, "-u", url, "-i", proto, "-b", str(batch),
           "--concurrency-range", str(concurrency), "-f", csv, "--verbose-csv", "--percentile=99"]
    # Time windows, not --request-count: with a fixed count perf_analyzer still closes its window
    # on a whole second, and its throughput comes out as count / whole seconds (500 or 250 req/s
    # on the CPU for any latency). Stable: the last three windows within --pa-stability %.
    cmd += ["-p", str(args.pa_window_ms), "-s", str(args.pa_stability), "-r", "8",
            "--warmup-request-count", str(warmup)]
    cmd += list(extra)
    rc, out = run_logged(cmd, timeout, name)
    if rc != 0 or not os.path.exists(csv):
        error(name, f"perf_analyzer exit {rc}: " + " | ".join(l for l in out.splitlines()[-4:] if l.strip()))
        return None
    return read_pa_csv(csv)


def read_pa_csv(path):
    with open(path) as f:
        lines = [l.strip() for l in f if l.strip()]
    if len(lines) < 2:
        return None
    head = lines[0].split(",")
    row = lines[1].split(",")
    vals = {}
    for h, v in zip(head, row):
        try:
            vals[h] = float(v)
        except ValueError:
            vals[h] = v
    return vals


def pa_summary(row):
    """perf_analyzer's figures (its CSV has µs); the server's own split of a request's time
    (queue, compute) where the server answers ModelStatistics."""
    if not row:
        return None
    g = lambda k: row.get(k)  # noqa: E731
    ms = lambda v: None if not isinstance(v, float) else round(v / 1e3, 4)  # noqa: E731
    out = {"infer_per_s": g("Inferences/Second"), "p50_ms": ms(g("p50 latency")), "p99_ms": ms(g("p99 latency"))}
    for col in ("Client Send", "Network+Server Send/Recv", "Server Queue", "Server Compute Input",
                "Server Compute Infer", "Server Compute Output", "Client Recv"):
        if isinstance(g(col), float):
            out[col.lower().replace(" ", "_").replace("+", "_").replace("/", "_") + "_us"] = g(col)
    return out


class PaFlood:
    """perf_analyzer flooding one model in the background until stop(): a stability of 1 %
    keeps it measuring (up to 50 windows of 4 s) until it is interrupted."""

    def __init__(self, args, url, model, batch, concurrency, name):
        self.name = name
        self.csv = os.path.join(OUT, f"{name}.csv")
        cmd = [args.perf_analyzer, "-m", model, "-u", url, "-i", "grpc", "-b", str(batch),
               "--concurrency-range", str(concurrency), "-p", "4000", "-s", "1", "-r", "50", "-f", self.csv,
               "--verbose-csv"]
        log(f"$ {' '.join(cmd)}  (background)")
        self.logf = open(os.path.join(OUT, f"{name}.log"), "w")
        self.logf.write(" ".join(cmd) + "\n")
        self.logf.flush()
        self.p = subprocess.Popen(cmd, stdout=self.logf, stderr=subprocess.STDOUT, start_new_session=True)
        with open(os.path.join(OUT, f"{name}.pid"), "w") as f:
            f.write(str(self.p.pid))

    def alive(self):
        return self.p.poll() is None

    def stop(self):
        if self.p.poll() is None:
            # perf_analyzer reports what it measured on SIGINT; SIGKILL if it does not end.
            os.killpg(self.p.pid, signal.SIGINT)
            try:
                self.p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait(10)
        self.logf.close()
        return self.p.returncode


# ---------------------------------------------------------------------------------------------
# Steps


def step_inproc(args, scenario, probes, rate_hz="max"):
    res = {}
    backend = args.backend or scenario.get("device", {}).get("backend", "cpu")
    for w in probes:
        r = {}
        path = os.path.join(OUT, f"inproc-{w['name']}.toml")
        with open(path, "w") as f:
            f.write(alone_scenario(scenario, w, args.inproc_seconds, rate_hz))
        out_dir = os.path.join(OUT, f"inproc-{w['name']}")
        cmd = [args.isolane, "run", path, "--quiet", "--out", out_dir]
        if args.backend:
            cmd += ["--backend", args.backend]
        rc, _ = run_logged(cmd, args.inproc_seconds + 180, f"inproc-{w['name']}")
        try:
            with open(os.path.join(out_dir, "summary.json")) as f:
                s = json.load(f)
            ws = s["workloads"][0]
            r["run"] = {"partition": w.get("partition", {}), "jobs": ws.get("completed"),
                        "p50_ms": ws["latency_ms"]["p50"], "p99_ms": ws["latency_ms"]["p99"],
                        "throughput_ips": ws.get("throughput_ips"), "exit_code": rc}
        except (OSError, KeyError, IndexError, ValueError) as e:
            error(f"inproc {w['name']}", f"isolane run exit {rc}, no summary ({e}); see inproc-{w['name']}.log")
        model = w.get("model", "")
        if backend == "cuda" and ":" not in model and not model.endswith(".onnx") and rate_hz == "max":
            cmd = [args.isolane, "bench", "--model", model, "--batch", "1", "--precision", w.get("precision", "fp16"),
                   "--replays", "2000", "--warmup", "100", "--json"]
            rc, out = run_logged(cmd, 240, f"bench-{w['name']}")
            for line in out.splitlines():
                if line.startswith("{"):
                    try:
                        b = json.loads(line)
                        r["bench_whole_gpu"] = {"p50_ms": b["median_ms"], "p99_ms": b["p99_ms"],
                                                "throughput_ips": b["throughput_ips"]}
                    except (ValueError, KeyError):
                        pass
            if "bench_whole_gpu" not in r:
                error(f"bench {w['name']}", f"exit {rc}, no JSON line; see bench-{w['name']}.log")
        res[w["name"]] = r
    return res


def overhead_paths(args, server, meta):
    """The client paths the overhead step measures: (key, protocol, url, extra perf_analyzer
    flags). `grpc-shm` is gRPC with the tensors in system shared memory (perf_analyzer registers
    the regions; the documented zero-copy local path) beside binary data over the socket;
    `grpc-stream` gRPC's ModelStreamInfer (each of perf_analyzer's concurrent slots sends its
    requests on a stream of its own)."""
    paths = []
    if server.grpc:
        paths.append(("grpc", "grpc", server.grpc, []))
    paths.append(("http", "http", server.http, []))
    if server.grpc and args.shm:
        out_bytes = 4 * math.prod(meta.get("output_dims") or [1]) or 4
        paths.append(("grpc-shm", "grpc", server.grpc,
                      ["--shared-memory", "system", "--output-shared-memory-size", str(max(out_bytes, 64))]))
    if server.grpc and args.stream:
        paths.append(("grpc-stream", "grpc", server.grpc, ["--streaming"]))
    return paths


def stage_protocol(key, proto):
    """The protocol under which the server counts a path's stages (`isolane_stages`)."""
    return "grpc-stream" if key == "grpc-stream" else proto


def sweep_levels(args, proto, deadline_ms, service_ms):
    """The concurrencies measured over `proto`, and those left out. perf_analyzer stops at the
    first refusal, and over HTTP it cannot send a request's own deadline: a level whose queue
    (concurrency x the model's latency) would not fit in the model's deadline is left out there;
    over gRPC each request carries a deadline of 1 s."""
    levels = sorted(set([1] + args.concurrencies))
    if proto == "grpc" or not deadline_ms or not service_ms:
        return levels, []
    keep = [c for c in levels if c == 1 or c * service_ms <= 0.6 * deadline_ms]
    return keep, [c for c in levels if c not in keep]


def step_overhead(args, server, metas, probes, inproc, res, spin_us=None):
    """Each probe model at batch 1: perf_analyzer at each concurrency of the sweep over every
    path, the server's stages at concurrency 1, and tritonclient at concurrency 1.
    `spin_us`: this server's `[timing] spin_us` when it is an A/B server (then concurrency 1
    alone, without tritonclient)."""
    for w in probes:
        name = w["name"]
        meta = metas[name]
        base = (inproc.get(name) or {}).get("run")
        r = res[name] = {"perf_analyzer": {}, "tritonclient": {}, "skipped": {}}
        if spin_us is not None:
            r["spin_us"] = spin_us
        floor = spin_us == "floor"
        paths = [p for p in overhead_paths(args, server, meta)
                 if spin_us is None or floor or p[0] not in ("grpc-shm", "grpc-stream")]
        runs = []
        for key, proto, url, pa_extra in paths:
            levels, skipped = sweep_levels(args, proto, w.get("deadline_ms"), base and base.get("p99_ms"))
            if spin_us is not None:
                levels, skipped = [1], []
            if skipped:
                r["skipped"][key] = skipped
            runs += [(conc, key, proto, url, pa_extra) for conc in levels]
        # Every path at concurrency 1 first, then the sweep level by level: what --budget-s
        # leaves out is the highest levels.
        runs.sort(key=lambda run: run[0])
        for conc, key, proto, url, pa_extra in runs:
            # The floor's server, after this one, keeps its time (--steps ...,floor).
            need = 15 + (args.floor_reserve_s if spin_us is None else 0)
            if args.perf_analyzer and conc > 1 and not time_left(args, need, f"{name} {key} at concurrency {conc}"):
                continue
            # A refusal stops perf_analyzer: over gRPC the requests carry a deadline far above
            # the model's (perf_analyzer sends request parameters over gRPC alone), so that
            # requests queued behind each other at concurrency > 1 are not refused.
            extra = (["--request-parameter", "deadline_ms:1000:int"] if proto == "grpc" else []) + pa_extra
            before = stage_totals(server.http, name) if conc == 1 else {}
            tag = f"-spin{spin_us}" if spin_us is not None else ""
            row = perf_analyzer(args, proto, url, name, 1, conc, f"overhead-{name}-{key}-c{conc}{tag}", extra=extra)
            r["perf_analyzer"][f"{key}_c{conc}"] = pa_summary(row)
            if conc == 1:
                # Where the server's time went, per request of this run (its warm-up too).
                r.setdefault("stages", {})[key] = stage_means(before, stage_totals(server.http, name),
                                                              stage_protocol(key, proto))
        for key, proto, url, _ in paths:
            if key == "grpc-shm" or (spin_us is not None and args.perf_analyzer):
                continue
            c = Client(key, url, name, meta)
            data = data_for(meta, 1)
            sequential(c, data, 50)
            before = stage_totals(server.http, name)
            r["tritonclient"][key] = sequential(c, data, args.py_requests)
            r.setdefault("stages_tritonclient", {})[key] = stage_means(before, stage_totals(server.http, name),
                                                                       stage_protocol(key, proto))
            c.close()
        if base:
            cmp = {}
            for key, s in r["perf_analyzer"].items():
                if s and s.get("p50_ms") is not None:
                    cmp[key] = {"added_us_p50": round((s["p50_ms"] - base["p50_ms"]) * 1e3, 1),
                                "added_us_p99": round((s["p99_ms"] - base["p99_ms"]) * 1e3, 1),
                                "throughput_ratio": round(s["infer_per_s"] / base["throughput_ips"], 4)
                                if base.get("throughput_ips") else None}
            for proto, s in r["tritonclient"].items():
                if s.get("p50_ms") is not None:
                    cmp[f"tritonclient_{proto}"] = {"added_us_p50": round((s["p50_ms"] - base["p50_ms"]) * 1e3, 1)}
            r["against_inproc"] = cmp
        r["best"] = best_throughput(r)


def split_key(key):
    """("grpc-shm", 4) of "grpc-shm_c4"."""
    path, conc = key.rsplit("_c", 1)
    return path, int(conc)


def best_throughput(r):
    """Per path, the concurrency of the sweep with the most requests per second, with its
    latencies and its share of in-process throughput."""
    best = {}
    for key, s in r.get("perf_analyzer", {}).items():
        if not s or s.get("infer_per_s") is None:
            continue
        path, conc = split_key(key)
        if path not in best or s["infer_per_s"] > best[path]["infer_per_s"]:
            best[path] = {"concurrency": conc, "infer_per_s": s["infer_per_s"], "p50_ms": s["p50_ms"],
                          "p99_ms": s["p99_ms"],
                          "throughput_ratio": r.get("against_inproc", {}).get(key, {}).get("throughput_ratio")}
    return best


def spin_scenario(scenario, probes, spin_us):
    """The probe workloads alone (each in its own partition, as in the scenario) with `[timing]
    spin_us` set (None: the scenario's own): the A/B server of the answer spin and the model
    thread's poll, and the floor's server."""
    lines = []
    for table in ("device", "timing", "protection"):
        values = dict(scenario.get(table, {}))
        if table == "timing" and spin_us is not None:
            values["spin_us"] = spin_us
        if values:
            lines.append(f"[{table}]")
            lines += [f"{k} = {toml_value(v)}" for k, v in values.items()]
    for w in probes:
        lines.append("[[workload]]")
        lines += [f"{k} = {toml_value(v)}" for k, v in w.items()]
    return "\n".join(lines) + "\n"


def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(num, value):
    """One protobuf field: an int as a varint, bytes or str length-delimited."""
    if isinstance(value, int):
        return _varint(num << 3) + _varint(value)
    if isinstance(value, str):
        value = value.encode()
    return _varint(num << 3 | 2) + _varint(len(value)) + value


def _value_info(name, dims):
    """onnx.ValueInfoProto of an f32 tensor (elem_type 1) of `dims`."""
    shape = b"".join(_field(1, _field(1, d)) for d in dims)
    tensor = _field(1, 1) + _field(2, shape)
    return _field(1, name) + _field(2, _field(1, tensor))


def floor_onnx(dims, input_name="input"):
    """The protocol floor's model, as ONNX bytes (no onnx package on the GPU machine): one
    GlobalAveragePool of a 1 x dims input, opset 13. The engine runs it in a few µs, so a served
    request of it costs what the protocol and the server's plumbing cost for that body."""
    node = _field(1, input_name) + _field(2, "output") + _field(4, "GlobalAveragePool")
    out_dims = [1] + list(dims[:1]) + [1] * (len(dims) - 1)
    graph = (_field(1, node) + _field(2, "floor") + _field(11, _value_info(input_name, [1] + list(dims)))
             + _field(12, _value_info("output", out_dims)))
    opset = _field(1, "") + _field(2, 13)
    return _field(1, 8) + _field(2, "serve_bench") + _field(7, graph) + _field(8, opset)


def floor_workloads(probes, metas):
    """Per probe model, its floor: the same device, partition and precision, the floor ONNX of
    its input shape (written into the output folder) in place of the model."""
    floors = []
    for w in probes:
        meta = metas.get(w["name"]) or {}
        dims = meta.get("dims")
        if not dims or len(dims) < 2:
            error(f"floor {w['name']}", f"input shape {dims} is not [C, ...]: no floor model")
            continue
        path = os.path.abspath(os.path.join(OUT, f"floor-{w['name']}.onnx"))
        with open(path, "wb") as f:
            f.write(floor_onnx(dims, meta.get("input") or "input"))
        fw = {k: v for k, v in w.items() if k not in ("weights", "calibration")}
        fw.update({"name": f"{w['name']}_floor", "model": path})
        floors.append(fw)
    return floors


def step_floor(args, has_grpc, scenario, probes, metas, inproc, res):
    """The protocol floor: a server of the probes and their floors alone (the scenario's own
    settings); each at concurrency 1 over every path, and the floors in-process."""
    floors = floor_workloads(probes, metas)
    if not floors:
        return
    fl_inproc = step_inproc(args, scenario, floors)
    res["inproc"] = fl_inproc
    # The probe in-process at the rate gRPC reached at concurrency 1: is its job slower with the
    # GPU idle between jobs (as when served one request at a time) than back to back?
    paced = res["inproc_paced"] = {}
    over = SUMMARY["steps"].get("overhead") or {}
    for w in probes:
        o = over.get(w["name"]) or {}
        rate = (((o.get("perf_analyzer") or {}).get("grpc_c1") or {}).get("infer_per_s")
                or 1e3 / (((o.get("tritonclient") or {}).get("grpc") or {}).get("p50_ms") or math.inf))
        if not rate or not time_left(args, 75, f"{w['name']} in-process at gRPC's concurrency-1 rate"):
            continue
        pw = dict(w, name=f"{w['name']}_paced")
        got = step_inproc(args, scenario, [pw], rate_hz=round(rate))
        paced[w["name"]] = dict((got.get(pw["name"]) or {}).get("run") or {}, rate_hz=round(rate))
    path = os.path.join(OUT, "floor.toml")
    with open(path, "w") as f:
        f.write(spin_scenario(scenario, probes + floors, None))
    server = Server(args, has_grpc, scenario=path, name="server-floor")
    try:
        server.start(args.ready_timeout)
        fmetas = {w["name"]: model_meta(server.http, w["name"]) for w in probes + floors}
        res["models"] = {w["name"]: w["model"] for w in floors}
        both = {**inproc, **fl_inproc}
        r = res["served"] = {}
        step_overhead(args, server, fmetas, floors + probes, both, r, spin_us="floor")
    finally:
        server.stop()


def floor_split(s):
    """Per probe and path: what a request adds at p50 over its in-process latency, split into
    the floor's own (the same body through the protocol to a model that does nothing) and the
    model path's above it, both measured in the floor's server."""
    fl = s["steps"].get("floor") or {}
    served = fl.get("served") or {}
    rows = []
    for name, r in served.items():
        if name.endswith("_floor"):
            continue
        f = served.get(f"{name}_floor") or {}
        for path in ("grpc", "http", "grpc-shm", "grpc-stream"):
            # perf_analyzer's rows; without it (the CPU kit check) tritonclient's.
            key, client, stages = f"{path}_c1", "perf_analyzer", "stages"
            if ((r.get("perf_analyzer") or {}).get(key) or {}).get("p50_ms") is None:
                key, client, stages = f"tritonclient_{path}", "tritonclient", "stages_tritonclient"
            mine = (r.get("against_inproc") or {}).get(key, {}).get("added_us_p50")
            floor = (f.get("against_inproc") or {}).get(key, {}).get("added_us_p50")
            if mine is None or floor is None:
                continue
            runs = f.get("perf_analyzer") if client == "perf_analyzer" else f.get("tritonclient")
            rows.append({"model": name, "path": path, "client": client, "added_us": mine, "floor_us": floor,
                         "above_floor_us": round(mine - floor, 1),
                         "floor_p50_ms": ((runs or {}).get(key if client == "perf_analyzer" else path) or {}).get("p50_ms"),
                         "floor_stages": (f.get(stages) or {}).get(path),
                         "stages": (r.get(stages) or {}).get(path)})
    return rows


def step_critical(args, server, metas, critical, best_effort, res):
    name = critical["name"]
    meta = metas[name]
    url = server.grpc or server.http
    proto = "grpc" if server.grpc else "http"
    res.update({"model": name, "protocol": proto, "rate_hz": args.critical_rate,
                "deadline_ms": critical.get("deadline_ms"), "seconds": args.critical_seconds})
    data = data_for(meta, 1, seed=1)
    for phase in ("alone", "flooded"):
        floods, py_stop, py_threads, py_counts = [], threading.Event(), [], {}
        try:
            if phase == "flooded":
                for w in best_effort:
                    rows = min(args.flood_batch or metas[w["name"]]["max_batch"], metas[w["name"]]["max_batch"])
                    if args.perf_analyzer and server.grpc:
                        floods.append(PaFlood(args, server.grpc, w["name"], rows, args.flood_concurrency,
                                              f"flood-{w['name']}"))
                    else:
                        py_counts[w["name"]] = {}
                        t = threading.Thread(target=python_flood, args=(url, w["name"], metas[w["name"]], rows,
                                             args.flood_concurrency, py_stop, py_counts[w["name"]]), daemon=True)
                        t.start()
                        py_threads.append(t)
                time.sleep(args.flood_warmup)
            before = server.metrics()
            t0 = time.time()
            c = Client(proto, url, name, meta)
            client = paced(c, data, args.critical_rate, args.critical_seconds)
            c.close()
            after = server.metrics()
            wall = time.time() - t0
            ph = {"client": client, "server": {name: model_figures(before, after, name)}}
            for w in best_effort:
                f = model_figures(before, after, w["name"])
                f["rows_per_s"] = round(f["rows"] / wall, 1)
                ph["server"][w["name"]] = f
            if phase == "flooded":
                stuck = [w["name"] for w in best_effort if not ph["server"][w["name"]]["rows"]]
                if stuck:
                    error("critical", f"best-effort model(s) {stuck} ran no job while flooded")
                died = [f.name for f in floods if not f.alive()]
                if died:
                    error("critical", f"perf_analyzer flood(s) ended before the critical stream did: {died}")
                ph["flood"] = {"tool": "perf_analyzer" if floods else "python (tritonclient gRPC threads)",
                               "concurrency": args.flood_concurrency, "batch": args.flood_batch or "max"}
        finally:
            # Whatever happened (the step's time limit included), no flood outlives its phase:
            # perf_analyzer runs in a session of its own, which the device machine would not end.
            codes = {f.name: f.stop() for f in floods}
            py_stop.set()
            for t in py_threads:
                t.join(30)
        if phase == "flooded":
            for f in floods:
                ph["flood"][f.name] = {"exit_code": codes[f.name]}
            if py_counts:
                ph["flood"]["python_counts"] = py_counts
        res[phase] = ph
        log(f"critical {phase}: {client['ok']} ok, {client['refused']} refused, {client['late']} late, "
            f"p50 {client['p50_ms']} ms, p99 {client['p99_ms']} ms")
    return res


def step_deadline(args, server, metas, critical, best_effort, res):
    res["calibration"] = {}
    # The server's own latency of each model at its full batch, one request at a time (from
    # /metrics: arrival to answer, without the client's transfer, which for 8 images of
    # 224x224 takes longer than the model).
    served = {}
    proto = "grpc" if server.grpc else "http"
    for w in [critical] + best_effort:
        if w is None:
            continue
        meta = metas[w["name"]]
        c = Client(proto, server.grpc or server.http, w["name"], meta)
        data = data_for(meta, meta["max_batch"])
        sequential(c, data, 3)
        before = server.metrics()
        s = sequential(c, data, 20)
        f = model_figures(before, server.metrics(), w["name"])
        c.close()
        res["calibration"][w["name"]] = {"rows": meta["max_batch"], "client_p50_ms": s["p50_ms"],
                                         "server_mean_ms": f["latency_mean_ms"]}
        if f["latency_mean_ms"]:
            served[w["name"]] = f["latency_mean_ms"]
        if not s["ok"]:
            error("deadline", f"{w['name']} answered none of its calibration requests: {s['messages'][:1]}")
    # (a) the slowest model at its full batch, with a deadline half its latency (whole ms).
    if served:
        name = max(served, key=served.get)
        service = served[name]
        rows = metas[name]["max_batch"]
        deadline = max(1, math.floor(service / 2))
        a = {"model": name, "rows": rows, "server_latency_ms": service, "deadline_ms": deadline,
             "below_service": deadline < 0.8 * service, "requests_per_protocol": args.deadline_requests}
        before = server.metrics()
        for proto_, url in (("grpc", server.grpc), ("http", server.http)):
            if url is None:
                continue
            c = Client(proto_, url, name, metas[name])
            a[proto_] = sequential(c, data_for(metas[name], rows, seed=2), args.deadline_requests, deadline)
            c.close()
        a["server"] = model_figures(before, server.metrics(), name)
        if not a["below_service"]:
            error("deadline", f"the slowest model answers a full batch in {service:.3f} ms: a whole-ms deadline "
                  "cannot be well below it; only the burst (b) tests refusals")
        res["impossible"] = a
        log(f"deadline (a): {name}, {rows} rows, {service:.3f} ms at the server, deadline {deadline} ms: "
            f"grpc {a.get('grpc', {}).get('refused')} refused / {a.get('grpc', {}).get('late')} late")
    # (b) a burst at the critical model: the queue makes later requests miss a tight deadline.
    if critical is not None:
        name = critical["name"]
        meta = metas[name]
        service = served.get(name)
        deadline = max(1, math.ceil(2 * service)) if service else 1
        b = {"model": name, "burst": args.burst, "rounds": args.burst_rounds, "deadline_ms": deadline,
             "server_latency_ms": service}
        before = server.metrics()
        for proto, url in (("grpc", server.grpc), ("http", server.http)):
            if url is None:
                continue
            b[proto] = burst(proto, url, name, meta, args.burst, args.burst_rounds, deadline)
        b["server"] = model_figures(before, server.metrics(), name)
        res["burst"] = b
        log(f"deadline (b): grpc {b.get('grpc', {})}")
    return res


# ---------------------------------------------------------------------------------------------
# The report


def fmt(v, d=3):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{d}f}"
    return str(v)


def targets(s):
    """Issue 32's targets against what was measured: one line each."""
    st, out = s["steps"], []
    yes = lambda ok: "met" if ok else "NOT met"  # noqa: E731
    for name, r in st.get("overhead", {}).items():
        cmp = r.get("against_inproc", {})
        g1 = cmp.get("grpc_c1", {}).get("added_us_p50")
        if g1 is not None:
            out.append(f"- {name}: gRPC adds {g1:.1f} µs at p50 (target <= 50 µs): {yes(g1 <= 50)}")
        best = (r.get("best") or {}).get("grpc")
        if best and best.get("throughput_ratio"):
            ratio = best["throughput_ratio"]
            out.append(f"- {name}: gRPC (binary data) throughput {ratio:.1%} of in-process at best, at concurrency "
                       f"{best['concurrency']} (p50 {fmt(best['p50_ms'])} ms, p99 {fmt(best['p99_ms'])} ms; target >= 90 %): "
                       f"{yes(ratio >= 0.9)}")
        # The "zero-copy local path": gRPC with the tensors in system shared memory.
        s1 = cmp.get("grpc-shm_c1", {}).get("added_us_p50")
        if s1 is not None:
            out.append(f"- {name}: gRPC with system shared memory (grpc-shm) adds {s1:.1f} µs at p50 (target <= 50 µs): "
                       f"{yes(s1 <= 50)}")
        best = (r.get("best") or {}).get("grpc-shm")
        if best and best.get("throughput_ratio"):
            ratio = best["throughput_ratio"]
            out.append(f"- {name}: grpc-shm throughput {ratio:.1%} of in-process at best, at concurrency "
                       f"{best['concurrency']} (target >= 90 %): {yes(ratio >= 0.9)}")
        # Streaming (ModelStreamInfer): no call set-up per request.
        t1 = cmp.get("grpc-stream_c1", {}).get("added_us_p50")
        if t1 is not None:
            out.append(f"- {name}: gRPC streaming (grpc-stream) adds {t1:.1f} µs at p50 (target <= 50 µs): "
                       f"{yes(t1 <= 50)}")
        best = (r.get("best") or {}).get("grpc-stream")
        if best and best.get("throughput_ratio"):
            ratio = best["throughput_ratio"]
            out.append(f"- {name}: grpc-stream throughput {ratio:.1%} of in-process at best, at concurrency "
                       f"{best['concurrency']} (target >= 90 %): {yes(ratio >= 0.9)}")
    pinned = s.get("shm_page_locked")
    if pinned:
        out.append(f"- shared memory regions: {pinned}")
    for x in floor_split(s):
        if x["path"] in ("grpc", "grpc-shm", "grpc-stream"):
            out.append(f"- {x['model']}: of {x['path']}'s {x['added_us']:.1f} µs added at p50 (the floor's server), the protocol "
                       f"floor is {x['floor_us']:.1f} µs and the model's path adds {x['above_floor_us']:.1f} µs above it")
    crit = st.get("critical", {}).get("flooded")
    if crit:
        c = crit["client"]
        m = st["critical"]["model"]
        out.append(f"- {m} while best effort is flooded: p99 {fmt(c['p99_ms'])} ms, {c['late']} late, {c['refused']} refused "
                   f"of {c['ok'] + c['refused'] + c['error']}")
    for case, d in st.get("deadline", {}).items():
        if case == "calibration":
            continue
        late = sum((d.get(p) or {}).get("late", 0) for p in ("grpc", "http"))
        refused = sum((d.get(p) or {}).get("refused", 0) for p in ("grpc", "http"))
        out.append(f"- deadlines below the model ({case}): {refused} refused up front, {late} answered late "
                   f"(target 0 late): {yes(late == 0)}")
    return ["## Targets (issue 32)", ""] + out + [""] if out else []


def shm_page_locked():
    """What the servers said (once each, on stderr) of page-locking clients' shared memory
    regions for the GPU (docs/serve.md, "Shared memory"): None where none said anything."""
    said = []
    for path in sorted(glob.glob(os.path.join(OUT, "server*.log"))):
        with open(path, errors="replace") as f:
            for line in f:
                if "page-locked" in line and line.startswith("isolane serve: shared memory region"):
                    said.append(f"{os.path.basename(path)}: {line.strip()[len('isolane serve: '):]}")
    return "; ".join(said) or None


def markdown(s):
    L = [f"# isolane serve: {s.get('scenario')}", ""]
    if s.get("device"):
        L += [f"Device: {s['device']}", ""]
    if s.get("server"):
        L += [f"Server: `{s['server'].get('ready_line', '')}`; exit code {s['server'].get('exit_code')}", ""]
    if s.get("cores"):
        on = s["cores"] >= 8
        how = "poll for answers due within 2 ms (8 cores or more)" if on else "park until each answer comes (fewer than 8)"
        L += [f"Host: {s['cores']} cores: the front ends {how}; docs/serve.md, \"Waiting for answers\".", ""]
    st = s["steps"]
    inproc = st.get("inproc", {})
    over = st.get("overhead", {})
    if over:
        L += ["## Overhead per request (batch 1, binary data, loopback)", "",
              "| model | client | p50 ms | p99 ms | req/s | added µs at p50 | throughput / in-process |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
        for name, r in over.items():
            base = (inproc.get(name) or {}).get("run")
            if base:
                part = base["partition"]
                where = f"{part['sms']} SMs" if "sms" in part else (", ".join(f"{k} {v}" for k, v in part.items())
                                                                    or "unpartitioned")
                L.append(f"| {name} | in-process (`isolane run`, {where}) | "
                         f"{fmt(base['p50_ms'])} | {fmt(base['p99_ms'])} | {fmt(base.get('throughput_ips'), 0)} | - | - |")
            bw = (inproc.get(name) or {}).get("bench_whole_gpu")
            if bw:
                L.append(f"| {name} | in-process (`isolane bench`, whole GPU) | {fmt(bw['p50_ms'])} | "
                         f"{fmt(bw['p99_ms'])} | {fmt(bw['throughput_ips'], 0)} | - | - |")
            cmp = r.get("against_inproc", {})
            for key, p in r.get("perf_analyzer", {}).items():
                if p:
                    c = cmp.get(key, {})
                    path, conc = split_key(key)
                    # Added latency means something one request at a time; at higher
                    # concurrency the requests queue behind each other and throughput tells.
                    added = c.get("added_us_p50") if conc == 1 else None
                    L.append(f"| {name} | perf_analyzer {path}, concurrency {conc} | {fmt(p['p50_ms'])} | "
                             f"{fmt(p['p99_ms'])} | {fmt(p['infer_per_s'], 0)} | {fmt(added, 1)} | "
                             f"{fmt(c.get('throughput_ratio'), 3)} |")
            for proto, p in r.get("tritonclient", {}).items():
                c = cmp.get(f"tritonclient_{proto}", {})
                L.append(f"| {name} | tritonclient (Python) {proto}, concurrency 1 | {fmt(p['p50_ms'])} | "
                         f"{fmt(p['p99_ms'])} | - | {fmt(c.get('added_us_p50'), 1)} | - |")
        L.append("")
        bests = [(name, path, b) for name, r in over.items() for path, b in r.get("best", {}).items()]
        if bests:
            L += ["### Best throughput of the concurrency sweep (perf_analyzer, batch 1)", "",
                  "`grpc-shm`: gRPC with the input and output tensors in system shared memory "
                  "(perf_analyzer's `--shared-memory system`), beside binary data over the socket. "
                  "`grpc-stream`: gRPC's ModelStreamInfer (perf_analyzer's `--streaming`), each concurrent "
                  "slot's requests on a stream of its own.", "",
                  "| model | path | concurrency | req/s | p50 ms | p99 ms | throughput / in-process |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
            for name, path, b in bests:
                L.append(f"| {name} | {path} | {b['concurrency']} | {fmt(b['infer_per_s'], 0)} | {fmt(b['p50_ms'])} | "
                         f"{fmt(b['p99_ms'])} | {fmt(b['throughput_ratio'], 3)} |")
            for name, r in over.items():
                for path, levels in r.get("skipped", {}).items():
                    L.append(f"\n{name} over {path}: concurrency {', '.join(map(str, levels))} left out (perf_analyzer "
                             "cannot send a request's own deadline over HTTP, and the model's would refuse that queue).")
            L.append("")
        staged = [(name, proto, m) for name, r in over.items() for proto, m in r.get("stages", {}).items() if m]
        if staged:
            order = [k for k in staged[0][2] if k != "server"]
            L += ["### Where the server's time went (perf_analyzer, concurrency 1; mean µs per stage)", "",
                  "From the call's header to its response built, as the server stamps them (the statistics "
                  "extension's `isolane_stages`); the client's latency beyond `server` is the socket and the client. "
                  "A streamed request has no header of its own: its `receive` is 0 and its time starts with "
                  "its message read.", "",
                  "| model | protocol | " + " | ".join(order) + " | server |",
                  "| --- | --- | " + " | ".join("---:" for _ in order) + " | ---: |"]
            for name, proto, m in staged:
                L.append(f"| {name} | {proto} | " + " | ".join(fmt(m.get(k), 1) for k in order)
                         + f" | {fmt(m.get('server'), 1)} |")
            L.append("")
    ab = st.get("overhead_spin")
    if ab:
        L += ["### The spin A/B (concurrency 1, perf_analyzer where there is one; a server of the probe models alone per `[timing] spin_us`)", "",
              "`spin_us` bounds the model thread's poll of its queue after a job and, on a machine of 8 cores or more, "
              "the front end's poll for an answer past its predicted time (docs/serve.md, \"Waiting for answers\"). "
              "`scenario`: the main server above, with the scenario's own setting (200 µs when it sets none).", "",
              "| model | path | spin_us | p50 ms | added µs at p50 | queue µs | wake µs | in the server µs |",
              "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
        runs = [("scenario", over)] + [(str(v), res) for v, res in ab.items()]
        for name in over:
            for path in ("grpc", "http"):
                for label, res in runs:
                    r = res.get(name) or {}
                    client = "perf_analyzer"
                    p = (r.get("perf_analyzer") or {}).get(f"{path}_c1")
                    st_ = (r.get("stages") or {}).get(path, {})
                    added = (r.get("against_inproc") or {}).get(f"{path}_c1", {}).get("added_us_p50")
                    if not p:
                        # Without perf_analyzer (the CPU kit check): tritonclient's rows.
                        client = "tritonclient"
                        p = (r.get("tritonclient") or {}).get(path)
                        st_ = (r.get("stages_tritonclient") or {}).get(path, {})
                        added = (r.get("against_inproc") or {}).get(f"tritonclient_{path}", {}).get("added_us_p50")
                    if not p or p.get("p50_ms") is None:
                        continue
                    L.append(f"| {name} | {path} ({client}) | {label} | {fmt(p['p50_ms'])} | {fmt(added, 1)} | "
                             f"{fmt(st_.get('queue'), 1)} | {fmt(st_.get('wake'), 1)} | {fmt(st_.get('server'), 1)} |")
        L.append("")
    split = floor_split(s)
    if split:
        L += ["### The protocol floor (concurrency 1; a server of the probe and its floor alone)", "",
              "The floor is a model that does almost nothing (a GlobalAveragePool) with the probe's input shape: a "
              "request to it carries the same body through the same client, socket and server plumbing. "
              "`added`: the served p50 minus the same model's in-process p50 (`isolane run`, the same partition), "
              "both measured here; `above the floor`: what the model's own path adds beyond the floor's.", "",
              "| model | path | added µs at p50 | the floor's added µs | above the floor µs | floor p50 ms | "
              "floor in the server µs | model in the server µs |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for x in split:
            L.append(f"| {x['model']} | {x['path']} ({x['client']}) | {fmt(x['added_us'], 1)} | {fmt(x['floor_us'], 1)} | "
                     f"{fmt(x['above_floor_us'], 1)} | {fmt(x['floor_p50_ms'])} | "
                     f"{fmt((x['floor_stages'] or {}).get('server'), 1)} | {fmt((x['stages'] or {}).get('server'), 1)} |")
        L.append("")
        for name, pr in ((st.get("floor") or {}).get("inproc_paced") or {}).items():
            base = (inproc.get(name) or {}).get("run") or {}
            if pr.get("p50_ms") is not None and base.get("p50_ms") is not None:
                L += [f"{name} in-process at {pr['rate_hz']} Hz (the rate of gRPC at concurrency 1, the model idle "
                      f"between jobs): p50 {fmt(pr['p50_ms'])} ms, against {fmt(base['p50_ms'])} ms back to back.", ""]
        fstages = [(n, p, m) for n, r in ((st.get("floor") or {}).get("served") or {}).items()
                   for p in ("grpc", "http", "grpc-shm", "grpc-stream")
                   for m in [((r.get("stages") or {}).get(p) or (r.get("stages_tritonclient") or {}).get(p))] if m]
        if fstages:
            order = [k for k in fstages[0][2] if k != "server"]
            L += ["Stages in the floor's server (mean µs per request):", "",
                  "| model | protocol | " + " | ".join(order) + " | server |",
                  "| --- | --- | " + " | ".join("---:" for _ in order) + " | ---: |"]
            for n, p, m in fstages:  # perf_analyzer's runs (tritonclient's on the CPU check)
                L.append(f"| {n} | {p} | " + " | ".join(fmt(m.get(k), 1) for k in order) + f" | {fmt(m.get('server'), 1)} |")
            L.append("")
    crit = st.get("critical")
    if crit:
        L += [f"## Critical model `{crit['model']}` ({crit['protocol']}, {crit['rate_hz']} Hz for {crit['seconds']} s, "
              f"deadline {crit['deadline_ms']} ms)", "",
              "| phase | answered | refused | late (client) | late (/metrics) | p50 ms | p99 ms | max ms | "
              "/metrics p99 bucket ms | best effort rows/s |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
        for phase in ("alone", "flooded"):
            ph = crit.get(phase)
            if not ph:
                continue
            c, sv = ph["client"], ph["server"][crit["model"]]
            be = ", ".join(f"{m}: {f['rows_per_s']}" for m, f in ph["server"].items() if m != crit["model"])
            L.append(f"| {phase} | {c['ok']} | {c['refused']} | {c['late']} | {sv['late']} | {fmt(c['p50_ms'])} | "
                     f"{fmt(c['p99_ms'])} | {fmt(c['max_ms'])} | {fmt(sv['latency_p99_bucket_ms'])} | {be or '-'} |")
        fl = (crit.get("flooded") or {}).get("flood")
        if fl:
            L += ["", f"Flood: {fl['tool']}, concurrency {fl['concurrency']} per best-effort model, batch "
                  f"{fl['batch']} per request."]
        L.append("")
    dl = st.get("deadline")
    if dl:
        L += ["## Deadlines below what the model can do", "",
              "| case | model | deadline ms | protocol | sent | refused | answered | late | errors |",
              "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
        for case, d in dl.items():
            if case == "calibration":
                continue
            for proto in ("grpc", "http"):
                p = d.get(proto)
                if not p:
                    continue
                sent = p["ok"] + p["refused"] + p["error"]
                what = (f"full batch ({d['rows']} rows), {fmt(d['server_latency_ms'])} ms at the server" if case == "impossible"
                        else f"burst of {d['burst']} × {d['rounds']}")
                L.append(f"| {what} | {d['model']} | {d['deadline_ms']} | {proto} | {sent} | {p['refused']} | "
                         f"{p['ok']} | {p['late']} | {p['error']} |")
        L.append("")
    if s.get("left_out"):
        L += ["## Left out for time", ""] + [f"- {x}" for x in s["left_out"]] + [""]
    L += targets(s)
    if s["errors"]:
        L += ["## Errors", ""] + [f"- {e}" for e in s["errors"]] + [""]
    return "\n".join(L)


class StepTimeout(Exception):
    pass


def step_timeout(*_):
    raise StepTimeout("the step ran past its time limit")


def main():
    global OUT
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--isolane", required=True)
    ap.add_argument("--scenario", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--perf-analyzer", help="perf_analyzer's path (none: Python clients alone)")
    ap.add_argument("--backend", choices=["cpu", "cuda"], help="passed to run and serve")
    ap.add_argument("--steps", default="inproc,overhead,critical,deadline")
    ap.add_argument("--quick", action="store_true", help="shorter everything (a check of the kit)")
    ap.add_argument("--inproc-seconds", type=float, default=5.0)
    ap.add_argument("--concurrencies", default=None,
                    help="the overhead step's concurrency sweep (over HTTP, only the levels whose queue fits in the "
                         "model's deadline: perf_analyzer cannot send a request's own deadline there; default 1,2,4,8, "
                         "--quick 1,2)")
    ap.add_argument("--no-shm", dest="shm", action="store_false",
                    help="leave out perf_analyzer's gRPC row with system shared memory")
    ap.add_argument("--no-stream", dest="stream", action="store_false",
                    help="leave out the gRPC streaming rows (ModelStreamInfer, perf_analyzer's --streaming)")
    ap.add_argument("--ab-spin-us", default=None,
                    help="after the overhead step, a server of the probe models alone per value with [timing] spin_us "
                         "set to it, measured at concurrency 1 (empty: none; default 0,2000, --quick 0)")
    # 1000 ms since the fourth path (grpc-stream): the overhead step's runs then take about the
    # time three paths took at 1500 ms, within scripts/session-gpu.sh's 300 s.
    ap.add_argument("--pa-window-ms", type=int, default=1000, help="perf_analyzer's measurement window")
    ap.add_argument("--pa-stability", type=int, default=25, help="perf_analyzer's -s (percent)")
    ap.add_argument("--py-requests", type=int, default=1000)
    ap.add_argument("--critical-rate", type=float, default=200.0)
    ap.add_argument("--critical-seconds", type=float, default=10.0)
    ap.add_argument("--flood-concurrency", type=int, default=16)
    ap.add_argument("--flood-batch", type=int, default=1, help="rows per flood request (0: the model's batch)")
    ap.add_argument("--flood-warmup", type=float, default=3.0)
    ap.add_argument("--deadline-requests", type=int, default=200)
    ap.add_argument("--burst", type=int, default=32)
    ap.add_argument("--burst-rounds", type=int, default=10)
    ap.add_argument("--ready-timeout", type=float, default=300.0)
    ap.add_argument("--budget-s", type=float, default=250.0,
                    help="the overhead step's sweep levels above 1, its shared memory rows and the spin A/B "
                         "servers start only while the driver has run less than this minus what each takes "
                         "(15 s, 45 s); what is left out is said (scripts/session-gpu.sh gives the step 300 s)")
    args = ap.parse_args()
    if args.quick:
        args.inproc_seconds, args.pa_window_ms, args.pa_stability, args.py_requests = 2.0, 1000, 50, 200
        args.critical_seconds, args.flood_warmup, args.deadline_requests = 4.0, 1.5, 40
        args.burst, args.burst_rounds, args.flood_concurrency = 16, 3, 8
    if args.concurrencies is None:
        args.concurrencies = "1,2" if args.quick else "1,2,4,8"
    if args.ab_spin_us is None:
        args.ab_spin_us = "0" if args.quick else "0,2000"
    try:
        args.concurrencies = [int(c) for c in args.concurrencies.split(",") if c.strip()]
        args.ab_spin_us = [int(v) for v in args.ab_spin_us.split(",") if v.strip()]
    except ValueError:
        ap.error("--concurrencies and --ab-spin-us take comma-separated whole numbers")
    if any(c < 1 for c in args.concurrencies) or any(v < 0 for v in args.ab_spin_us):
        ap.error("--concurrencies takes counts of 1 or more, --ab-spin-us µs of 0 or more")
    OUT = args.out
    os.makedirs(OUT, exist_ok=True)
    steps = set(args.steps.split(","))
    # What the floor step takes (two in-process runs, a server of two models, eight perf_analyzer
    # runs at concurrency 1): the main server's sweep leaves it that much of --budget-s.
    args.floor_reserve_s = 100 if "floor" in steps else 0
    with open(args.scenario, "rb") as f:
        scenario = tomllib.load(f)
    workloads = scenario.get("workload", [])
    critical = [w for w in workloads if w.get("criticality", "critical") == "critical"]
    best_effort = [w for w in workloads if w.get("criticality") == "best_effort"]
    probes = [w for w in critical if w.get("batch", 1) == 1]
    SUMMARY.update({"scenario": args.scenario, "args": vars(args), "cores": len(os.sched_getaffinity(0)), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        SUMMARY["device"] = smi.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        SUMMARY["device"] = None
    if args.perf_analyzer:
        rc, out = run_logged([args.perf_analyzer, "--version"], 30, "perf_analyzer-version")
        SUMMARY["perf_analyzer"] = out.strip().splitlines()[-1] if rc == 0 and out.strip() else None
        if rc != 0:
            error("perf_analyzer", f"`--version` exit {rc}: not used ({out.strip()[-200:]})")
            args.perf_analyzer = None
    help_rc, help_out = run_logged([args.isolane, "serve", "--help"], 30, "serve-help")
    has_grpc = "--grpc" in help_out
    if not has_grpc:
        error("serve", "this isolane has no `serve --grpc`: HTTP alone is measured")

    server = Server(args, has_grpc)
    stop_now = lambda *_: (server.stop(), sys.exit(130))  # noqa: E731
    signal.signal(signal.SIGTERM, stop_now)
    signal.signal(signal.SIGINT, stop_now)

    def save():
        SUMMARY["shm_page_locked"] = shm_page_locked()
        with open(os.path.join(OUT, "summary.json"), "w") as f:
            json.dump(SUMMARY, f, indent=1, default=str)
        with open(os.path.join(OUT, "summary.md"), "w") as f:
            f.write(markdown(SUMMARY))

    try:
        if "inproc" in steps and probes:
            SUMMARY["steps"]["inproc"] = step_inproc(args, scenario, probes)
            save()
        server.start(args.ready_timeout)
        metas = {w["name"]: model_meta(server.http, w["name"]) for w in workloads}
        SUMMARY["models"] = metas
        for stepname in ("overhead", "critical", "deadline"):
            if stepname not in steps:
                continue
            limit = {"overhead": 420, "critical": 2 * args.critical_seconds + 2 * args.flood_warmup + 150,
                     "deadline": 300}[stepname]
            signal.signal(signal.SIGALRM, step_timeout)
            signal.alarm(int(limit))
            try:
                # Each step fills its part of the summary as it goes: a step stopped by its
                # time limit (or the whole driver by SIGTERM) keeps what it had measured.
                r = SUMMARY["steps"][stepname] = {}
                if stepname == "overhead" and probes:
                    step_overhead(args, server, metas, probes, SUMMARY["steps"].get("inproc", {}), r)
                elif stepname == "critical" and critical:
                    step_critical(args, server, metas, critical[0], best_effort, r)
                elif stepname == "deadline":
                    step_deadline(args, server, metas, critical[0] if critical else None, best_effort, r)
            except Exception as e:  # one step's failure is reported; the others still run
                error(stepname, f"{type(e).__name__}: {e}")
            finally:
                signal.alarm(0)
            save()
    except Exception as e:
        error("run", f"{type(e).__name__}: {e}")
    finally:
        server.stop()
        save()
    if "floor" in steps and probes and SUMMARY.get("models"):
        # After the main server: its partitions are free for the floor's server.
        if time_left(args, 60, "the protocol floor's server"):
            r = SUMMARY["steps"]["floor"] = {}
            signal.signal(signal.SIGALRM, step_timeout)
            signal.alarm(200)
            try:
                step_floor(args, has_grpc, scenario, probes, SUMMARY["models"],
                           SUMMARY["steps"].get("inproc", {}), r)
            except Exception as e:  # noqa: BLE001 - reported; the rest still runs
                error("floor", f"{type(e).__name__}: {e}")
            finally:
                signal.alarm(0)
                save()
    if "overhead" in steps and probes and args.ab_spin_us:
        # After the main server: its partitions are free for the probes' own.
        SUMMARY["steps"]["overhead_spin"] = {}
        for spin_us in args.ab_spin_us:
            if not time_left(args, 45, f"the spin A/B server with spin_us {spin_us}"):
                continue
            path = os.path.join(OUT, f"spin{spin_us}.toml")
            with open(path, "w") as f:
                f.write(spin_scenario(scenario, probes, spin_us))
            ab = Server(args, has_grpc, scenario=path, name=f"server-spin{spin_us}")
            stop_now = lambda *_: (ab.stop(), sys.exit(130))  # noqa: E731
            signal.signal(signal.SIGTERM, stop_now)
            signal.signal(signal.SIGINT, stop_now)
            signal.signal(signal.SIGALRM, step_timeout)
            signal.alarm(180)
            try:
                ab.start(args.ready_timeout)
                ab_metas = {w["name"]: model_meta(ab.http, w["name"]) for w in probes}
                r = SUMMARY["steps"]["overhead_spin"][spin_us] = {}
                step_overhead(args, ab, ab_metas, probes, SUMMARY["steps"].get("inproc", {}), r, spin_us=spin_us)
            except Exception as e:  # noqa: BLE001 - reported; the other values still run
                error(f"spin A/B {spin_us}", f"{type(e).__name__}: {e}")
            finally:
                signal.alarm(0)
                ab.stop()
                save()
    print(markdown(SUMMARY))
    return 1 if SUMMARY["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
