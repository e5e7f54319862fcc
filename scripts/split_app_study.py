#!/usr/bin/env python3
"""One app split over two GPUs (scenarios/gpu/two-gpus-app-split.toml): its preprocess on GPU 0,
its detector on GPU 1, the preprocessed tensor moved between them peer to peer (transfer =
"auto"), staged through host memory ("staged") or handed on through the stages' host buffers
("host"); beside it the same app on GPU 0 alone (device to device, and through the host).
Each set-up is one `isolane run`; the table compares the move's time with the end to end.

    python3 scripts/split_app_study.py --isolane stage/isolane --out results/h100x2-split-app [--duration 10]
"""
import argparse
import json
import pathlib
import re
import subprocess
import sys

SETUPS = [
    # name, transfer, detector's GPU
    ("split-peer", "auto", 1),
    ("split-staged", "staged", 1),
    ("split-host", "host", 1),
    ("one-gpu-device", "auto", 0),
    ("one-gpu-host", "host", 0),
]


def scenario(base: str, transfer: str, gpu: int, duration: float) -> str:
    text = re.sub(r'^transfer = "\w+"', f'transfer = "{transfer}"', base, flags=re.M)
    text = re.sub(r"duration_s = [\d.]+", f"duration_s = {duration}", text)
    # The detector is the stage whose `gpu` follows `model = "yolov8n"`.
    return text.replace('model = "yolov8n"\ngpu = 1', f'model = "yolov8n"\ngpu = {gpu}')


def row(name: str, transfer: str, gpu: int, summary: dict) -> str:
    app = summary["apps"][0]
    det = next(s for s in app["stages"] if s["name"] == "detector")
    pre = next(s for s in app["stages"] if s["name"] == "preprocess")
    e2e = app["end_to_end"]
    lat = e2e["latency_ms"]
    moved = det.get("transfer")
    links = ", ".join(moved["links"]) if moved else "— (host tensor)"
    t = moved["latency_ms"] if moved else {}
    fmt = lambda v: "—" if v is None else f"{v:.3f}"
    return (
        f"| {name} | {transfer} | GPU 0 → GPU {gpu} | {links} | {fmt(t.get('p50'))} | {fmt(t.get('p99'))} "
        f"| {fmt(pre['latency_ms']['p50'])} | {fmt(det['latency_ms']['p50'])} | {fmt(lat['p50'])} "
        f"| {fmt(lat['p99'])} | {fmt(lat['max'])} | {e2e['timeout_pct']:.2f} |"
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--isolane", default="stage/isolane")
    ap.add_argument("--out", required=True)
    ap.add_argument("--duration", type=float, default=10)
    ap.add_argument("--scenario", default="scenarios/gpu/two-gpus-app-split.toml")
    a = ap.parse_args()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    base = pathlib.Path(a.scenario).read_text()
    rows = []
    for name, transfer, gpu in SETUPS:
        path = out / f"{name}.toml"
        path.write_text(scenario(base, transfer, gpu, a.duration))
        run_dir = out / name
        r = subprocess.run([a.isolane, "run", str(path), "--out", str(run_dir), "--force", "--quiet"])
        if r.returncode != 0:
            print(f"{name}: isolane run exited with {r.returncode}", file=sys.stderr)
            continue
        summary = json.loads((run_dir / "summary.json").read_text())
        rows.append(row(name, transfer, gpu, summary))
    table = [
        "| set-up | transfer | preprocess → detector | link | move p50 ms | move p99 ms | preprocess p50 ms "
        "| detector p50 ms (move included) | end to end p50 ms | p99 ms | max ms | timeouts % |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *rows,
    ]
    text = "\n".join(table) + "\n"
    (out / "split-app.md").write_text(text)
    print(text)
    return 0 if len(rows) == len(SETUPS) else 1


if __name__ == "__main__":
    sys.exit(main())
