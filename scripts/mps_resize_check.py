#!/usr/bin/env python3
"""An MPS client's share, or a green partition's SMs, changed while it serves (issue 35), on a
GPU machine.

    python3 scripts/mps_resize_check.py --isolane ISOLANE --scenario scenarios/serve/h200-mps.toml \
        --model mobilenet_v2 --to 10 [--rate 100] [--seconds 8] [--deadline-ms 50]
    python3 scripts/mps_resize_check.py --isolane ISOLANE --scenario scenarios/serve/h200.toml \
        --model mobilenet_v2 --key sms --to 16 --over 128

Starts `isolane serve`, sends the model requests at --rate (HTTP, binary data, a seeded
random image, each with its own --deadline-ms) for --seconds, and halfway through runs `isolane ctl resize MODEL
KEY=TO` (KEY: thread_pct, or sms for a green partition). Prints one JSON line: the change's reply (time to serving, pause), the model's
service estimate before and after (ctl status), and the requests answered, refused, late and
failed (none may be lost: every request gets an answer or a refusal). Then asks for a share over
the budget and checks it is refused (exit 2). The server is stopped with SIGTERM.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


def ctl(isolane, addr, *args):
    return subprocess.run([isolane, "ctl", "--server", addr, "--json", *args],
                          capture_output=True, text=True, timeout=600)


def status_of(isolane, addr, model):
    out = ctl(isolane, addr, "status")
    for m in json.loads(out.stdout)["models"]:
        if m["name"] == model:
            return m
    raise SystemExit(f"no {model} in {out.stdout}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--isolane", required=True)
    p.add_argument("--scenario", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--to", type=int, required=True)
    p.add_argument("--key", default="thread_pct", choices=["thread_pct", "sms"])
    p.add_argument("--over", type=int, default=None,
                   help="a size over the budget, refused (default: 100 %% of the threads, or 128 SMs)")
    p.add_argument("--rate", type=float, default=100.0)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--deadline-ms", type=int, default=50,
                   help="each request's own deadline, whole ms as the protocol takes it (the "
                        "scenario's may be tighter than the model can keep at a small share)")
    a = p.parse_args()
    server = subprocess.Popen([a.isolane, "serve", a.scenario, "--http", "127.0.0.1:0",
                               "--grpc", "127.0.0.1:0"], stdout=subprocess.PIPE,
                              stderr=open("/tmp/mps-resize-server.log", "w"), text=True,
                              start_new_session=True)
    ready = server.stdout.readline()
    if not ready.startswith("isolane serve: ready"):
        raise SystemExit(f"not ready: {ready!r}; {open('/tmp/mps-resize-server.log').read()[-2000:]}")
    addr = ready.split("HTTP on ")[1].split(",")[0]
    client = httpclient.InferenceServerClient(addr, concurrency=4)
    meta = client.get_model_metadata(a.model)
    shape = [1] + [int(d) for d in meta["inputs"][0]["shape"][1:]]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    counts = {"answered": 0, "late": 0, "refused": 0, "failed": 0, "sent": 0}
    lock = threading.Lock()
    before = status_of(a.isolane, addr, a.model)
    change = {}

    def resize():
        time.sleep(a.seconds / 2)
        out = ctl(a.isolane, addr, "resize", a.model, f"{a.key}={a.to}")
        change["rc"] = out.returncode
        change["reply"] = out.stdout.strip() or out.stderr.strip()

    t = threading.Thread(target=resize)
    t.start()
    pending = []
    start = time.monotonic()
    k = 0
    while time.monotonic() - start < a.seconds:
        due = start + k / a.rate
        time.sleep(max(0.0, due - time.monotonic()))
        i = httpclient.InferInput(meta["inputs"][0]["name"], shape, "FP32")
        i.set_data_from_numpy(x, binary_data=True)
        pending.append(client.async_infer(a.model, [i],
                                          parameters={"deadline_ms": a.deadline_ms}))
        k += 1
    for r in pending:
        with lock:
            counts["sent"] += 1
        try:
            res = r.get_result()
            params = res.get_response().get("parameters", {})
            counts["answered"] += 1
            counts["late"] += bool(params.get("late"))
        except InferenceServerException as e:
            key = "refused" if "refused" in str(e) or "429" in str(e.status() or "") else "failed"
            counts[key] += 1
    t.join()
    after = status_of(a.isolane, addr, a.model)
    over_to = a.over if a.over is not None else (100 if a.key == "thread_pct" else 128)
    over = ctl(a.isolane, addr, "resize", a.model, f"{a.key}={over_to}")
    os.killpg(server.pid, signal.SIGTERM)
    code = server.wait(timeout=120)
    print(json.dumps({
        "model": a.model, "key": a.key, "to": a.to, "change": change, "counts": counts,
        "before": {"partition": before["partition"], "service_ms": before["load"]["service_ms"]},
        "after": {"partition": after["partition"], "service_ms": after["load"]["service_ms"]},
        "over_budget": {"rc": over.returncode, "said": (over.stderr or over.stdout).strip()[:300]},
        "server_exit": code,
    }))


if __name__ == "__main__":
    sys.exit(main())
