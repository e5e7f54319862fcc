#!/usr/bin/env python3
"""Writes the hand-made GPU-shaped samples of this folder (see README.md): telemetry of an
H100-like run, partition and concurrency sweeps, and max-rate results per mechanism.

Deterministic (fixed seed), so re-running it changes nothing. The shapes follow what the
papers report (paper 000 Figs. 4-7, Tables II-III; paper 001 Figs. 6-7) at H100 scale; the
numbers are made up, not measured. Run from this folder: python3 make_gpu_samples.py
"""
import copy
import json
import math
import os
import random
import shutil

random.seed(6)
HERE = os.path.dirname(os.path.abspath(__file__))


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def dump(path, obj):
    write(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def stat(values):
    return {"mean": sum(values) / len(values), "min": min(values), "max": max(values)}


def latency(p50):
    return {
        "mean": p50 * 1.01, "std": p50 * 0.02, "min": p50 * 0.97, "p10": p50 * 0.98,
        "p50": p50, "p90": p50 * 1.03, "p95": p50 * 1.04, "p99": p50 * 1.08,
        "p999": p50 * 1.15, "max": p50 * 1.2, "tail": p50 * 0.16, "flatness": p50 * 0.05,
    }


def workload(name, model, batch, throughput_ips, memory_mib, wall_s=5.0):
    jobs = max(1, int(throughput_ips * wall_s / batch))
    p50 = 1000.0 * batch / throughput_ips
    return {
        "name": name, "model": model, "batch": batch, "rate_hz": None, "deadline_ms": None,
        "host": "thread", "status": "ok", "wall_s": wall_s, "jobs": jobs, "completed": jobs,
        "timeouts": 0, "timeout_pct": 0.0, "latency_ms": latency(p50),
        "throughput_ips": throughput_ips,
        "start_lateness_us": {"p50": 0.4, "p99": 3.0, "max": 12.0},
        "gpu_memory_mib": memory_mib, "energy_j": None, "j_per_image": None,
    }


def telemetry_summary(power, sm_clock, temp, mem_used, energy, reasons=()):
    return {
        "source": "nvml", "device": "NVIDIA H100 80GB HBM3", "period_ms": 50.0,
        "samples": 100, "duration_s": 5.0, "power_w": stat(power), "energy_j": energy,
        "energy_source": "counter", "sm_clock_mhz": stat(sm_clock),
        "mem_clock_mhz": {"mean": 2619.0, "min": 2619.0, "max": 2619.0},
        "temperature_c": stat(temp), "memory_used_mib": stat(mem_used),
        "gpu_util_pct": {"mean": 97.0, "min": 90.0, "max": 100.0},
        "sm_util_pct": None, "sm_occupancy_pct": None, "tensor_util_pct": None,
        "dram_bw_util_pct": None, "throttle_reasons": list(reasons),
        "sampler_cpu_s": 0.012, "sampler_cpu_pct": 0.24, "sampler_overruns": 0,
    }


def summary(workloads, telemetry, scenario):
    return {
        "isolane_version": "0.1.0", "command": "run", "status": "ok", "interrupted": False,
        "started_at": "2026-11-22T08:00:00Z", "host": "h100-sample", "scenario": scenario,
        "t0_monotonic_ns": 1_000_000_000, "wall_s": 5.0, "workloads": workloads,
        "telemetry": telemetry,
    }


def scenario_toml(mechanism, workloads):
    s = f'[device]\nbackend = "cuda"\ngpu = 0\nmechanism = "{mechanism}"\nhost = "thread"\n'
    for w in workloads:
        s += (f'\n[[workload]]\nname = "{w["name"]}"\nmodel = "{w["model"]}"\n'
              f'batch = {w["batch"]}\nrate_hz = "max"\nduration_s = 5\n')
    return s


def run_telemetry():
    """run-telemetry: the real CPU run of run-cpu/ plus a hand-made H100-like telemetry.csv
    (two phases: idle, then load with a power-capped clock dip) and summary.telemetry."""
    src, dst = os.path.join(HERE, "run-cpu"), os.path.join(HERE, "run-telemetry")
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    with open(os.path.join(dst, "summary.json")) as f:
        s = json.load(f)
    rows, power, clock, temp, mem, t = [], [], [], [], [], -0.3
    energy, temp_c = 0.0, 36.0
    header = ("t_s,power_w,energy_j,sm_clock_mhz,mem_clock_mhz,temperature_c,throttle_reasons,"
              "memory_used_mib,gpu_util_pct,mem_util_pct,sm_util_pct,sm_occupancy_pct,"
              "tensor_util_pct,dram_bw_util_pct,process_memory_mib")
    while t <= s["wall_s"] + 0.2:
        load = 0.0 if t < 0 else min(1.0, 0.4 + t / 2)
        p = 72 + 560 * load + random.gauss(0, 8)
        capped = p > 600
        c = 1755 if capped else 1980
        reasons = "sw_power_cap" if capped else ""
        temp_c += (34 + 30 * load - temp_c) * 0.05
        energy += p * 0.05
        m = 1200 + 1800 * (t >= 0)
        sm = 95 * load
        rows.append(f"{t:.3f},{p:.1f},{energy:.3f},{c},2619,{temp_c:.0f},{reasons},{m},"
                    f"{100 * load:.0f},{45 * load:.0f},{sm:.1f},{sm * 0.6:.1f},{sm * 0.4:.1f},"
                    f"{50 * load:.1f},4242:{m - 600}")
        power.append(p); clock.append(c); temp.append(round(temp_c)); mem.append(m)
        t += 0.05
    write(os.path.join(dst, "telemetry.csv"), header + "\n" + "\n".join(rows) + "\n")
    s["telemetry"] = telemetry_summary(power, clock, temp, mem, energy, ["sw_power_cap"])
    s["telemetry"]["samples"] = len(rows)
    s["telemetry"]["sm_util_pct"] = {"mean": 70.0, "min": 0.0, "max": 95.0}
    dump(os.path.join(dst, "summary.json"), s)


def sweep_partition(name, mechanism, sizes, key, model="convnext_large"):
    """A partition sweep in the layout `isolane sweep partition` writes."""
    root = os.path.join(HERE, name)
    shutil.rmtree(root, ignore_errors=True)
    points = []
    whole = sizes[-1]
    for size in sizes:
        frac = size / whole
        # Throughput grows with the share and saturates (large models fill the GPU); memory
        # barely moves (green contexts and MPS do not partition memory); power follows load.
        thr = 310 * (1 - math.exp(-3.2 * frac)) / (1 - math.exp(-3.2)) * random.uniform(0.98, 1.02)
        mem = 1480 + 40 * frac + random.uniform(-5, 5)
        power = [120 + 420 * frac + random.gauss(0, 6) for _ in range(20)]
        d = f"{key}-{size:03d}"
        w = workload(model, model, 1, thr, mem)
        tel = telemetry_summary(power, [1980] * 20, [40 + 18 * frac] * 20, [mem + 600] * 20,
                                sum(power) / 20 * 5)
        dump(os.path.join(root, d, "summary.json"),
             summary([w], tel, os.path.join(name, d, "scenario.toml")))
        write(os.path.join(root, d, "scenario.toml"), scenario_toml(mechanism, [w]))
        points.append({"dir": d, "status": "ok", "exit_code": 0, key: size})
    dump(os.path.join(root, "sweep.json"), {
        "isolane_version": "0.1.0", "kind": "partition", "model": model, "backend": "cuda",
        "mechanism": mechanism, "precision": "fp16", "device_model": "h100-sxm",
        "unit": key, "partition_applied": True, "rate_hz": None, "duration_s": 5.0,
        "points": points,
    })


def sweep_concurrency(name="sweep-concurrency", model="resnet50"):
    root = os.path.join(HERE, name)
    shutil.rmtree(root, ignore_errors=True)
    points = []
    for n in (1, 2, 4, 8):
        for b in (1, 2, 4, 8, 16):
            # Total throughput saturates with concurrency x batch (paper 001): per-workload
            # throughput (T/P) falls as workloads are added.
            demand = n * b
            total = 9000 * (1 - math.exp(-demand / 12)) * random.uniform(0.97, 1.03)
            per = total / n
            mem = 520 + 90 * b
            d = f"w{n}-b{b:02d}"
            ws = [workload(f"{model}-{i}", model, b, per, mem) for i in range(n)]
            power = [150 + 520 * (1 - math.exp(-demand / 10)) + random.gauss(0, 5)
                     for _ in range(20)]
            tel = telemetry_summary(power, [1980] * 20, [45] * 20, [n * mem + 600] * 20,
                                    sum(power) / 20 * 5)
            dump(os.path.join(root, d, "summary.json"),
                 summary(ws, tel, os.path.join(name, d, "scenario.toml")))
            write(os.path.join(root, d, "scenario.toml"), scenario_toml("timeslice", ws))
            points.append({"dir": d, "status": "ok", "exit_code": 0, "workloads": n,
                           "batch": b})
    dump(os.path.join(root, "sweep.json"), {
        "isolane_version": "0.1.0", "kind": "concurrency", "model": model, "backend": "cuda",
        "mechanism": "timeslice", "precision": "fp16", "partition_applied": False,
        "rate_hz": None, "duration_s": 5.0, "points": points,
    })


def maxrate_gpu():
    """Max-rate results per mechanism, as `isolane maxrate --backend cuda --mechanism ...`
    writes them (backend, mechanism, sms / thread_pct), in the shape of Tables II-III."""
    rates = {"resnet18": (1450, 1440, 1210), "vit_b_16": (610, 605, 520),
             "convnext_large": (190, 189, 175)}
    cols = (("timeslice", {}), ("mps", {"thread_pct": 50}), ("green", {"sms": 64}))
    for model, fs in rates.items():
        for (mech, part), f in zip(cols, fs):
            d = os.path.join(HERE, "maxrate-gpu", f"{model}-{mech}")
            obj = {"isolane_version": "0.1.0", "model": model, "batch": 1,
                   "backend": "cuda", "precision": "fp32", "mechanism": mech,
                   "sms": None, "thread_pct": None, "max_rate_hz": float(f),
                   "l_max_ms": 1000.0 / f, "initial_rate_hz": f * 1.04,
                   "config": {"jobs": 1000, "validations": 3, "step": {"absolute": 1.0},
                              "acceptance": "zero_violations", "max_batches": 10000},
                   "start_lateness_us": {"p50": 0.3, "p99": 2.5, "max": 9.0},
                   "trace": []}
            obj.update(part)
            dump(os.path.join(d, "maxrate.json"), obj)


def isolation_gpu(model="resnet18"):
    """2-workload isolation folders for three mechanisms (paper 000 Fig. 8 shape): the
    victim at its max rate, the interferer ramping; summary.json, isolation.csv and the
    scenario's mechanism, no per-job CSVs."""
    rates = [100 * (i + 1) for i in range(8)]
    shapes = {
        "timeslice": lambda i: min(100.0, max(0.0, 12.0 * (i - 1) + random.uniform(-2, 2))),
        "mps": lambda i: min(100.0, max(0.0, 5.0 * (i - 3) + random.uniform(-1, 1))),
        "green": lambda i: max(0.0, 0.4 * (i - 5) + random.uniform(-0.2, 0.2)),
    }
    header = ("step,interferer_rate_hz,victim,jobs,completed,timeouts,timeout_pct,mean_ms,"
              "p50_ms,p90_ms,p99_ms,max_ms,throughput_ips")
    for mech, f in shapes.items():
        root = os.path.join(HERE, "isolation-gpu", f"{model}-{mech}")
        shutil.rmtree(root, ignore_errors=True)
        rows = []
        for i, r in enumerate(rates):
            pct = round(f(i), 2)
            jobs = 2580
            t = round(jobs * pct / 100)
            p50 = 0.62 + 0.002 * r / 100 * (mech != "green")
            rows.append(f"{i},{r},victim,{jobs},{jobs},{t},{pct:.4f},{p50 * 1.02:.6f},"
                        f"{p50:.6f},{p50 * 1.1:.6f},{p50 * 1.4:.6f},{p50 * 2.2:.6f},"
                        f"{(jobs - t) / 2.0:.3f}")
        write(os.path.join(root, "isolation.csv"), header + "\n" + "\n".join(rows) + "\n")
        victim = workload("victim", model, 1, 1290.0, 310.0, wall_s=16.0)
        victim["rate_hz"] = 1290.0
        interferer = workload("interferer", model, 1, 450.0, 310.0, wall_s=16.0)
        s = summary([victim, interferer], None, f"isolation-gpu/{model}-{mech}.toml")
        s["command"] = "isolation"
        s["wall_s"] = 16.0
        s.pop("telemetry")
        dump(os.path.join(root, "summary.json"), s)
        write(os.path.join(root, "scenario.toml"),
              f'[device]\nbackend = "cuda"\ngpu = 0\nmechanism = "{mech}"\n'
              f'host = "{"thread" if mech == "green" else "process"}"\n')


if __name__ == "__main__":
    run_telemetry()
    sweep_partition("sweep-partition-green", "green", list(range(8, 129, 8)), "sms")
    sweep_partition("sweep-partition-mps", "mps", list(range(10, 101, 10)), "thread_pct")
    sweep_concurrency()
    maxrate_gpu()
    isolation_gpu()
