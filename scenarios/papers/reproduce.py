#!/usr/bin/env python3
"""Reproduce the studies of papers 000 and 001 on the H100 with isolane (issue 6, item 4).

Studies (defined in studies.json, explained in README.md):
  a  max stable rate (Algorithm 1) of six models per partition      -> isolane maxrate
  b  2-workload isolation sweeps (victim at its IMS from a)          -> isolane isolation
  c  4-workload isolation sweeps (3 victims at their IMS from a)     -> isolane isolation
  d  partition sweep of convnext_large (green, mps)                  -> isolane sweep partition
  e  concurrency x batch sweep of resnet50 and yolov8n (fp16)        -> isolane sweep concurrency
and finally `isolane report` over every results folder.

Python 3 standard library only. Typical use, on the GPU machine:
  python3 scenarios/papers/reproduce.py --scale quick            # results/h100/
  python3 scenarios/papers/reproduce.py --dry-run                # commands, scenarios, estimate
  python3 scenarios/papers/reproduce.py --backend cpu --scale tiny --out /tmp/p   # CPU stand-in
"""

import argparse
import datetime
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
STUDIES = ("a", "b", "c", "d", "e")
FOLDERS = {
    "a": "a-maxrate",
    "b": "b-isolation-2",
    "c": "c-isolation-4",
    "d": "d-partition-sweep",
    "e": "e-concurrency-sweep",
}
COMPLETE = "COMPLETE.json"
STATE = "state.json"
# What `isolane plan` says when this build refuses real models on backend = "cuda".
NO_CUDA_ENGINE = "needs the engine's CUDA backend"


class Failed(Exception):
    pass


class BudgetReached(Exception):
    pass


def now_iso():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def fmt_s(s):
    s = int(round(s))
    if s < 60:
        return "%ds" % s
    if s < 3600:
        return "%dm%02ds" % (s // 60, s % 60)
    return "%dh%02dm" % (s // 3600, (s % 3600) // 60)


def write_json(path, value):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(value, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def read_json(path):
    with open(path) as f:
        return json.load(f)


def fill(template, fields, name):
    """Replace every {field} (a bare identifier in braces) of template; unknown ones are errors."""

    def sub(m):
        key = m.group(1)
        if key not in fields:
            raise Failed("%s: unknown template field {%s}" % (name, key))
        return str(fields[key])

    return re.sub(r"\{([a-z][a-z0-9_]*)\}", sub, template)


def rate_str(hz):
    return ("%.3f" % hz).rstrip("0").rstrip(".")


class Driver:
    def __init__(self, args, spec):
        self.args = args
        self.spec = spec
        self.scale = spec["scales"][args.scale]
        self.cpu = args.backend == "cpu"
        self.out = os.path.abspath(args.out)
        self.failures = []
        self.precision = "fp32" if self.cpu else (args.precision or spec["precision"])
        self.batch = spec["batch"]
        self.given_ims = read_json(args.ims) if args.ims else {}
        self.isolane = args.isolane
        self.only = set(STUDIES)
        self.t_start = time.monotonic()

    # ---------------------------------------------------------------- running commands

    def log_command(self, start, elapsed, rc, argv, note=""):
        if self.args.dry_run:
            return
        os.makedirs(self.out, exist_ok=True)
        with open(os.path.join(self.out, "commands.txt"), "a") as f:
            f.write(
                "%s\t%8.1fs\trc=%s\t%s%s\n"
                % (start, elapsed, rc, " ".join(shlex.quote(a) for a in argv), note)
            )

    def run(self, argv, log_path=None, gpu=True, check=True):
        """Run one isolane command. gpu=False: an offline command, also run in --dry-run."""
        argv = [self.isolane] + [str(a) for a in argv]
        shown = " ".join(shlex.quote(a) for a in argv)
        if self.args.dry_run and gpu:
            print("  [dry-run] " + shown)
            return 0, ""
        print("  $ " + shown, flush=True)
        start, t0 = now_iso(), time.monotonic()
        try:
            p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        except KeyboardInterrupt:
            self.log_command(start, time.monotonic() - t0, 130, argv, "\t(interrupted)")
            raise
        elapsed = time.monotonic() - t0
        self.log_command(start, elapsed, p.returncode, argv)
        if log_path:
            os.makedirs(os.path.dirname(log_path), exist_ok=True)
            with open(log_path, "w") as f:
                f.write("# %s\n# %s  %.1fs  rc=%d\n" % (shown, start, elapsed, p.returncode))
                f.write(p.stdout)
        if p.returncode == 130:
            raise KeyboardInterrupt
        if p.returncode != 0 and check:
            tail = "\n".join(p.stdout.strip().splitlines()[-6:])
            raise Failed("exit %d after %.1fs: %s\n%s" % (p.returncode, elapsed, shown, tail))
        return p.returncode, p.stdout

    # ---------------------------------------------------------------- study bookkeeping

    def precision_of(self, study):
        """Study e has its own precision (paper 001's fp16); a-d take --precision."""
        if study == "e":
            return "fp32" if self.cpu else self.spec["e"]["precision"]
        return self.precision

    def key(self, study):
        k = {
            "study": study,
            "scale": self.args.scale,
            "backend": self.args.backend,
            "precision": self.precision_of(study),
        }
        # Only where it differs from the papers' protocol, so that earlier results keep their key.
        if study in ("b", "c") and self.args.victim_load != 1.0:
            k["victim_load"] = self.args.victim_load
        return k

    def study_dir(self, study):
        return os.path.join(self.out, FOLDERS[study])

    def is_complete(self, study):
        p = os.path.join(self.study_dir(study), COMPLETE)
        if not os.path.isfile(p):
            return False
        try:
            return read_json(p).get("key") == self.key(study)
        except (OSError, ValueError):
            return False

    def load_state(self, study):
        p = os.path.join(self.study_dir(study), STATE)
        if os.path.isfile(p):
            try:
                s = read_json(p)
                if s.get("key") == self.key(study):
                    return s
            except ValueError:
                pass
        return {"key": self.key(study), "done": {}}

    def save_state(self, study, state):
        write_json(os.path.join(self.study_dir(study), STATE), state)

    def sub_run(self, study, state, name, fn):
        """Run fn() once for a sub-run; remembered in state.json so a rerun skips it."""
        if name in state["done"]:
            print("  = %s/%s done (skipped)" % (FOLDERS[study], name))
            return True
        if self.args.budget_s is not None and not self.args.dry_run:
            est = dict(self.sub_runs(study, self.scale)).get(name, 0.0)
            used = time.monotonic() - self.t_start
            if used + est > self.args.budget_s:
                raise BudgetReached("%s/%s (estimated %s) would not fit in the %s left of --budget-s"
                                    % (FOLDERS[study], name, fmt_s(est), fmt_s(self.args.budget_s - used)))
        elif self.args.dry_run:
            est = dict(self.sub_runs(study, self.scale)).get(name)
            if est is not None:
                print("  ~ %s/%s: estimated %s at %s scale" % (FOLDERS[study], name, fmt_s(est), self.args.scale))
        try:
            info = fn()
        except Failed as e:
            self.failures.append("%s/%s: %s" % (FOLDERS[study], name, e))
            print("  ! %s/%s failed: %s" % (FOLDERS[study], name, e), file=sys.stderr)
            return False
        if not self.args.dry_run:
            state["done"][name] = info or {"at": now_iso()}
            self.save_state(study, state)
        return True

    def out_flag(self, path):
        """--out PATH, plus --force where an earlier attempt left something there."""
        if os.path.isdir(path) and os.listdir(path):
            return ["--out", path, "--force"]
        return ["--out", path]

    # ---------------------------------------------------------------- models and partitions

    def model_for(self, model, config):
        if not self.cpu:
            return model
        st = self.spec["cpu_standin"]
        return "spin:%gms" % round(st["base_ms"][model] * st["factor"].get(config, 1.0), 3)

    def a_runs(self):
        for group in self.spec["a"]["runs"]:
            for model in group["models"]:
                for config in group["configs"]:
                    yield model, config

    def ims(self, model, config):
        """(rate_hz, source): measured by study a, else (dry-run only) given or assumed."""
        name = "%s-%s" % (model, config)
        p = os.path.join(self.study_dir("a"), name, "maxrate.json")
        # Only a run of study a at this scale, backend and precision counts (its state.json).
        if name in self.load_state("a")["done"] and os.path.isfile(p):
            try:
                r = read_json(p)
                if r.get("backend") == self.args.backend and r.get("model") == self.model_for(model, config):
                    return float(r["max_rate_hz"]), "measured by study (a): %s" % os.path.relpath(p, self.out)
            except (ValueError, KeyError):
                pass
        if not self.args.dry_run:
            return None, None
        given = self.given_ims.get(model, {}).get(config)
        if given is not None:
            return float(given), "ASSUMED (given in %s; not measured)" % self.args.ims
        if self.cpu:
            ms = self.spec["cpu_standin"]["base_ms"][model] * self.spec["cpu_standin"]["factor"][config]
            return round(800.0 / ms, 1), "ASSUMED (cpu stand-in default; not measured)"
        a = self.spec["assumed_ims_hz"][model][config]
        return float(a), "ASSUMED (studies.json assumed_ims_hz, from paper 000 Table II; not measured)"

    # ---------------------------------------------------------------- study a

    def study_a(self, state):
        d = self.study_dir("a")
        sc = self.scale
        step = sc["step"]
        step_args = (
            ["--step", step["absolute"]] if "absolute" in step else ["--relative-step", step["relative"]]
        )
        for model, config in self.a_runs():
            cfg = self.spec["configs"][config]
            name = "%s-%s" % (model, config)
            run_dir = os.path.join(d, name)

            def go(model=model, config=config, cfg=cfg, run_dir=run_dir, name=name):
                argv = ["maxrate", "--model", self.model_for(model, config),
                        "--backend", self.args.backend, "--batch", self.batch,
                        "--precision", self.precision,
                        "--jobs", sc["jobs"], "--validations", sc["validations"]] + step_args
                argv += sc.get("maxrate_args", [])
                if not self.cpu:
                    argv += ["--gpu", self.args.gpu, "--mechanism", cfg["mechanism"]]
                    if "sms" in cfg:
                        argv += ["--sms", cfg["sms"]]
                    if "thread_pct" in cfg:
                        argv += ["--thread-pct", cfg["thread_pct"]]
                    if self.args.pin:
                        argv += ["--cpu", self.args.first_cpu]
                argv += self.out_flag(run_dir)
                self.run(argv, os.path.join(d, "logs", name + ".log"))
                if self.args.dry_run:
                    return None
                r = read_json(os.path.join(run_dir, "maxrate.json"))
                return {"max_rate_hz": r["max_rate_hz"], "l_max_ms": r["l_max_ms"], "at": now_iso()}

            self.sub_run("a", state, name, go)
        if not self.args.dry_run:
            self.write_ims_table()

    def write_ims_table(self):
        d = self.study_dir("a")
        table, rows = {}, []
        for model, config in self.a_runs():
            hz, _ = self.ims(model, config)
            if hz is None:
                continue
            table.setdefault(model, {})[config] = {"max_rate_hz": hz, "l_max_ms": 1e3 / hz}
            rows.append((model, config, hz))
        write_json(os.path.join(d, "ims.json"), table)
        with open(os.path.join(d, "ims.md"), "w") as f:
            configs = []
            for _, c in self.a_runs():
                if c not in configs:
                    configs.append(c)
            f.write("Max stable rate (Hz), batch %d, %s, %s backend, scale %s\n\n"
                    % (self.batch, self.precision, self.args.backend, self.args.scale))
            f.write("| model | " + " | ".join(self.spec["configs"][c]["label"] for c in configs) + " |\n")
            f.write("| --- |" + " --- |" * len(configs) + "\n")
            for model in dict.fromkeys(m for m, _ in self.a_runs()):
                cells = ["%.1f" % table[model][c]["max_rate_hz"] if c in table.get(model, {}) else "-"
                         for c in configs]
                f.write("| %s | %s |\n" % (model, " | ".join(cells)))

    # ---------------------------------------------------------------- studies b and c

    def ramp(self, victim_hz):
        sc = self.scale
        steps = sc["iso_steps"]
        step_s = max(sc["iso_min_step_s"], sc["iso_victim_jobs_per_step"] / victim_hz)
        step_s = math.ceil(step_s * 100) / 100.0
        return steps, step_s

    def iso_scenario(self, study, model, mech, config):
        spec = self.spec[study]
        with open(os.path.join(HERE, spec["template"])) as f:
            template = f.read()
        # The template's own header documents the fields; the generated file starts at its note.
        cut = template.find("{generated_note}")
        template = template[cut:]
        hz, source = self.ims(model, config)
        if hz is None:
            raise Failed(
                "no IMS of %s under %s: study (a) has not measured it (run --only a first; "
                "it should be in %s)" % (model, config, os.path.join(FOLDERS["a"], "%s-%s" % (model, config)))
            )
        load = self.args.victim_load
        victim_hz = hz * load
        steps, step_s = self.ramp(victim_hz)
        cfg = self.spec["configs"][config]
        if self.cpu:
            partition = "# partition: none on the cpu stand-in (would be %s)" % cfg["label"]
        elif "sms" in cfg:
            partition = "partition = { sms = %d }" % cfg["sms"]
        elif "thread_pct" in cfg:
            partition = "partition = { thread_pct = %d }" % cfg["thread_pct"]
        else:
            partition = "# partition: none (timeslice: each workload a process on the whole GPU)"
        note = [
            "# GENERATED by scenarios/papers/reproduce.py from %s (%s) on %s: do not edit."
            % (spec["template"], FOLDERS[study], now_iso()),
            "# model %s, mechanism %s, partition %s, scale %s, backend %s."
            % (model, mech, cfg["label"], self.args.scale, self.args.backend),
            "# victim rate and interferer top rate %s Hz: %s." % (rate_str(hz), source),
        ]
        if load != 1.0:
            note.append("# victims released at %s x that rate (--victim-load): %s Hz, deadline = their "
                        "period; the interferer still ramps to the full rate." % (rate_str(load), rate_str(victim_hz)))
        if source.startswith("ASSUMED"):
            note.append("# !!! ASSUMED VALUE (--dry-run): not a measurement; study (a) must run first. !!!")
        if self.cpu:
            note.append("# CPU STAND-IN: %s is replaced by %s; nothing is partitioned."
                        % (model, self.model_for(model, config)))
        fields = {
            "generated_note": "\n".join(note),
            "backend": self.args.backend,
            "gpu": self.args.gpu,
            "mechanism": "none" if self.cpu else mech,
            "model": self.model_for(model, config),
            "batch": self.batch,
            "precision": self.precision,
            "victim_rate_hz": rate_str(victim_hz),
            "duration_s": rate_str(steps * step_s),
            "warmup_jobs": 10 if not self.cpu else 2,
            "ramp_from_hz": 1,
            "ramp_to_hz": rate_str(max(hz, 1.0)),
            "ramp_steps": steps,
            "ramp_step_s": rate_str(step_s),
            "partition": partition,
        }
        names = ["victim_cpu"] if spec["victims"] == 1 else ["victim%d_cpu" % (i + 1) for i in range(spec["victims"])]
        names.append("interferer_cpu")
        for i, n in enumerate(names):
            pin = (not self.cpu) and self.args.pin
            fields[n] = "cpu = [%d]" % (self.args.first_cpu + i) if pin else "# cpu: not pinned"
        return fill(template, fields, spec["template"]), victim_hz, steps, step_s, source

    def plan_check(self, path, log_dir):
        """isolane plan on a generated scenario; where this build refuses real models on cuda
        (no CUDA engine yet), the partitions alone are checked on a spin-model copy."""
        argv = ["plan", path]
        dm = self.args.device_model or (self.spec["device_model"] if self.args.dry_run and not self.cpu else None)
        if dm:
            argv += ["--device-model", dm]
        name = os.path.splitext(os.path.basename(path))[0]
        rc, out = self.run(argv, os.path.join(log_dir, "plan-" + name + ".log"), gpu=False, check=False)
        if rc == 0:
            return "admitted"
        if NO_CUDA_ENGINE in out:
            with open(path) as f:
                text = f.read()
            text = re.sub(r'(?m)^model = "[^"]*"', 'model = "spin:1ms"', text)
            with tempfile.TemporaryDirectory() as tmp:
                p2 = os.path.join(tmp, os.path.basename(path))
                with open(p2, "w") as f:
                    f.write(text)
                rc2, out2 = self.run(["plan", p2] + argv[2:], None, gpu=False, check=False)
            if rc2 == 0:
                msg = ("partitions admitted (checked on a spin-model copy); this isolane build "
                       "refuses real models on backend = \"cuda\" (no CUDA engine yet)")
                print("  ~ %s: %s" % (os.path.basename(path), msg))
                return msg
            out = out2
        raise Failed("isolane plan rejects %s:\n%s" % (path, out.strip()))

    def study_iso(self, study, state):
        d = self.study_dir(study)
        spec = self.spec[study]
        # --dry-run writes its scenarios (with assumed rates) apart, never over a real run's.
        gen = os.path.join(self.out, "dry-run", FOLDERS[study]) if self.args.dry_run else d
        scen_dir = os.path.join(gen, "scenarios")
        os.makedirs(scen_dir, exist_ok=True)
        for model in spec["models"]:
            for mech, config in spec["mechanisms"].items():
                # Unique across studies b and c: the report names run sections by folder.
                name = "%s-%s-%dw" % (model, mech, spec["victims"] + 1)

                def go(model=model, mech=mech, config=config, name=name):
                    text, hz, steps, step_s, source = self.iso_scenario(study, model, mech, config)
                    path = os.path.join(scen_dir, name + ".toml")
                    with open(path, "w") as f:
                        f.write(text)
                    top = hz / self.args.victim_load
                    print("  scenario %s: victim %s Hz (%s%s), ramp 1 -> %s Hz, %d x %ss"
                          % (os.path.relpath(path, self.out), rate_str(hz), source.split(":")[0],
                             "" if self.args.victim_load == 1.0 else " x %s" % rate_str(self.args.victim_load),
                             rate_str(top), steps, rate_str(step_s)))
                    admitted = self.plan_check(path, os.path.join(gen, "logs"))
                    run_dir = os.path.join(d, name)
                    argv = ["isolation", path, "-q"] + self.out_flag(run_dir)
                    self.run(argv, os.path.join(d, "logs", name + ".log"))
                    return {"victim_rate_hz": hz, "ramp_steps": steps, "step_s": step_s,
                            "plan": admitted, "at": now_iso()}

                self.sub_run(study, state, name, go)

    # ---------------------------------------------------------------- studies d and e

    def sweep_common(self):
        sc = self.scale
        argv = ["--backend", self.args.backend, "--duration-s", sc["sweep_duration_s"],
                "--warmup", sc["sweep_warmup"], "-q"]
        if not self.cpu:
            argv += ["--gpu", self.args.gpu]
        return argv

    def study_d(self, state):
        d = self.study_dir("d")
        spec = self.spec["d"]
        for mech in spec["mechanisms"]:
            name = "%s-%s" % (spec["model"], mech)

            def go(mech=mech, name=name):
                run_dir = os.path.join(d, name)
                model = self.model_for(spec["model"], "timeslice")
                argv = ["sweep", "partition", "--model", model, "--mechanism", mech,
                        "--batch", self.batch, "--precision", self.precision]
                sizes = self.scale.get("partition_sizes", {}).get(mech)
                if sizes:
                    argv += ["--sizes", ",".join(str(s) for s in sizes)]
                if self.cpu or self.args.device_model:
                    argv += ["--device-model", self.args.device_model or self.spec["device_model"]]
                argv += self.sweep_common() + self.out_flag(run_dir)
                self.run(argv, os.path.join(d, "logs", name + ".log"))
                return None

            self.sub_run("d", state, name, go)

        # The unpartitioned baseline (paper 000 compares MIG with no MIG): the same model alone
        # on the whole GPU, one process, closed loop, as one concurrency point.
        name = "%s-whole" % spec["model"]

        def whole(name=name):
            argv = ["sweep", "concurrency", "--model", self.model_for(spec["model"], "timeslice"),
                    "--workloads", "1", "--batch", self.batch, "--precision", self.precision,
                    "--mechanism", "timeslice"]
            argv += self.sweep_common() + self.out_flag(os.path.join(d, name))
            self.run(argv, os.path.join(d, "logs", name + ".log"))
            return None

        self.sub_run("d", state, name, whole)

    def study_e(self, state):
        d = self.study_dir("e")
        spec = self.spec["e"]
        for model in spec["models"]:
            def go(model=model):
                run_dir = os.path.join(d, model)
                workloads = self.scale.get("concurrency_workloads", spec["workloads"])
                batch = self.scale.get("concurrency_batch", spec["batch"])
                precision = self.precision_of("e")
                argv = ["sweep", "concurrency", "--model", self.model_for(model, "timeslice"),
                        "--workloads", ",".join(map(str, workloads)),
                        "--batch", ",".join(map(str, batch)),
                        "--precision", precision, "--mechanism", spec["mechanism"]]
                argv += self.sweep_common() + self.out_flag(run_dir)
                self.run(argv, os.path.join(d, "logs", model + ".log"))
                return None

            self.sub_run("e", state, model, go)

    # ---------------------------------------------------------------- report

    def result_dirs(self, study):
        d = self.study_dir(study)
        if not os.path.isdir(d):
            return []
        found = []
        for name in sorted(os.listdir(d)):
            p = os.path.join(d, name)
            if not os.path.isdir(p) or name in ("logs", "scenarios"):
                continue
            marker = {"a": "maxrate.json", "b": "summary.json", "c": "summary.json",
                      "d": "sweep.json", "e": "sweep.json"}[study]
            if os.path.isfile(os.path.join(p, marker)):
                found.append(p)
        return found

    def report(self):
        dirs = [p for s in STUDIES for p in self.result_dirs(s)]
        out = os.path.join(self.out, "report.html")
        title = "isolane: papers 000 and 001 on %s (%s scale, %s backend)" % (
            "the CPU stand-in" if self.cpu else "the H100", self.args.scale, self.args.backend)
        if self.args.dry_run:
            print("  [dry-run] %s report <every results folder> --out %s --title %s"
                  % (self.isolane, out, shlex.quote(title)))
            return
        if not dirs:
            print("report: no results folder yet")
            return
        try:
            self.run(["report"] + dirs + ["--out", out, "--title", title],
                     os.path.join(self.out, "report.log"), gpu=False)
            print("report: %s (%d folders)" % (out, len(dirs)))
        except Failed as e:
            self.failures.append("report: %s" % e)

    # ---------------------------------------------------------------- time estimates

    # Time model (README.md, "Time estimates"): every command costs run_overhead_s (process
    # start, engine build, warm-up) plus what it measures:
    #   a  maxrate: the back-to-back batch (~0.8 N / IMS) and B timed batches of N / IMS each,
    #      B = search batches (from f0, assumed search_gap_fraction below the IMS, to the first
    #      miss) + K validations + failed_validations;
    #   b, c  isolation: steps x step_s (the ramp; victims run all of it);
    #   d, e  sweeps: per point duration_s + run_overhead_s;
    # plus extra_process_s per extra worker process and mps_daemon_s for a private MPS daemon.

    def est_consts(self):
        est = dict(self.spec["estimate"])
        if self.cpu:
            est.update(est["cpu"])
        return est

    def est_a(self, sc, model, config):
        est = self.est_consts()
        hz = self.ims_any(model, config)
        n = sc["jobs"]
        step = sc["step"]
        if "absolute" in step:
            search = 1 + math.ceil(est["search_gap_fraction"] * hz / step["absolute"])
        else:
            search = 1 + math.ceil(math.log(1 + est["search_gap_fraction"]) / math.log(1 + step["relative"]))
        batches = search + sc["validations"] + est["failed_validations"]
        t = est["run_overhead_s"] + 0.8 * n / hz + batches * n / hz
        if self.spec["configs"][config]["mechanism"] == "mps":
            t += est["mps_daemon_s"] + est["extra_process_s"]
        return t

    def est_iso(self, sc, study, model, mech, config):
        est = self.est_consts()
        hz = self.ims_any(model, config) * self.args.victim_load
        step_s = max(sc["iso_min_step_s"], sc["iso_victim_jobs_per_step"] / hz)
        t = est["run_overhead_s"] + sc["iso_steps"] * step_s + est["iso_extra_s"]
        if mech != "green":
            t += self.spec[study]["victims"] * est["extra_process_s"]
        if mech == "mps":
            t += est["mps_daemon_s"]
        return t

    def est_d(self, sc, mech):
        est = self.est_consts()
        sizes = sc.get("partition_sizes", {}).get(mech)
        if not sizes:
            sizes = list(range(8, self.spec["device_sms"] + 1, 8)) if mech == "green" else list(range(10, 101, 10))
        per = sc["sweep_duration_s"] + est["run_overhead_s"]
        if mech == "mps":
            per += est["mps_daemon_s"] + est["extra_process_s"]
        return len(sizes) * per

    def est_e(self, sc, model):
        est = self.est_consts()
        spec = self.spec["e"]
        wl = sc.get("concurrency_workloads", spec["workloads"])
        bs = sc.get("concurrency_batch", spec["batch"])
        return sum(len(bs) * (sc["sweep_duration_s"] + est["run_overhead_s"] + (w - 1) * est["extra_process_s"])
                   for w in wl)

    def sub_runs(self, study, sc):
        """(name, estimated seconds) of every sub-run of a study at scale sc."""
        if study == "a":
            return [("%s-%s" % (m, c), self.est_a(sc, m, c)) for m, c in self.a_runs()]
        if study in ("b", "c"):
            spec = self.spec[study]
            return [("%s-%s-%dw" % (m, mech, spec["victims"] + 1), self.est_iso(sc, study, m, mech, c))
                    for m in spec["models"] for mech, c in spec["mechanisms"].items()]
        if study == "d":
            est = self.est_consts()
            return [("%s-%s" % (self.spec["d"]["model"], mech), self.est_d(sc, mech))
                    for mech in self.spec["d"]["mechanisms"]] + [
                ("%s-whole" % self.spec["d"]["model"], sc["sweep_duration_s"] + est["run_overhead_s"])]
        return [(m, self.est_e(sc, m)) for m in self.spec["e"]["models"]]

    def estimate(self, scale_name):
        """Seconds per study at a scale, from the IMS values (measured where study a has run,
        else assumed) and the ramp and sweep lengths; and the longest single command."""
        sc = self.spec["scales"][scale_name]
        res = {s: sum(t for _, t in self.sub_runs(s, sc)) for s in STUDIES}
        res["report"] = self.est_consts()["report_s"]
        longest = max(((t, s, n) for s in STUDIES if s in self.only for n, t in self.sub_runs(s, sc)),
                      default=(0, "", ""))
        return res, longest

    def ims_any(self, model, config):
        hz, _ = self.ims(model, config)
        if hz is None:
            hz = self.given_ims.get(model, {}).get(config) or self.spec["assumed_ims_hz"][model][config]
        return float(hz)

    def print_estimate(self):
        scales = ["paper", "quick", "brief"] if not self.cpu else [self.args.scale]
        ests = {s: self.estimate(s) for s in scales}
        measured = all(not (self.ims(m, c)[1] or "ASSUMED").startswith("ASSUMED") for m, c in self.a_runs())
        print("\nEstimated device time per study (%s IMS values; overheads from studies.json "
              "\"estimate\"):" % ("measured" if measured else "ASSUMED"))
        print("  %-22s" % "study" + "".join("%12s" % s for s in scales))
        for s in list(STUDIES) + ["report"]:
            if s != "report" and s not in self.only:
                continue
            label = FOLDERS.get(s, "report")
            print("  %-22s" % label + "".join("%12s" % fmt_s(ests[sc][0][s]) for sc in scales))
        print("  %-22s" % "total" + "".join(
            "%12s" % fmt_s(sum(v for k, v in ests[sc][0].items() if k == "report" or k in self.only))
            for sc in scales))
        print("  %-22s" % "longest command" + "".join(
            "%12s" % fmt_s(ests[sc][1][0]) for sc in scales))
        for sc in scales:
            t, study, name = ests[sc][1]
            print("  longest at %s scale: %s/%s (%s)%s" % (
                sc, FOLDERS.get(study, "?"), name, fmt_s(t),
                "  -- longer than 10 min: split device sessions accordingly" if t > 600 else ""))

    # ---------------------------------------------------------------- preflight

    def cuda_engine_missing(self):
        """True when this isolane build refuses real networks on backend = "cuda" (its `plan`
        says the engine's CUDA backend is not available). Then `isolane maxrate --backend cuda`
        would time the model on the CPU engine inside the GPU partition: a wrong IMS, silently."""
        text = ('[device]\nbackend = "cuda"\nmechanism = "timeslice"\n[[workload]]\n'
                'name = "probe"\nmodel = "resnet18"\nrate_hz = 10\njobs = 1\n')
        with tempfile.TemporaryDirectory() as tmp:
            p = os.path.join(tmp, "probe.toml")
            with open(p, "w") as f:
                f.write(text)
            rc, out = self.run(["plan", p, "--device-model", self.spec["device_model"]],
                               None, gpu=False, check=False)
        return rc != 0 and NO_CUDA_ENGINE in out

    # ---------------------------------------------------------------- main loop

    def main(self, only):
        self.only = only
        os.makedirs(self.out, exist_ok=True)
        if not self.args.dry_run:
            with open(os.path.join(self.out, "commands.txt"), "a") as f:
                f.write("# %s reproduce.py %s (isolane: %s)\n"
                        % (now_iso(), " ".join(shlex.quote(a) for a in sys.argv[1:]), self.isolane))
        if not self.cpu and self.cuda_engine_missing():
            msg = ("this isolane build (%s) has no CUDA engine for real networks: `isolane plan` "
                   "refuses them on backend = \"cuda\", and `isolane maxrate --backend cuda` would "
                   "time them on the CPU engine" % self.isolane)
            if not self.args.dry_run:
                print("reproduce.py: " + msg + "; nothing run (use --dry-run or --backend cpu)",
                      file=sys.stderr)
                return 1
            print("\nWARNING: " + msg + "; the plan checks below admit the partitions only.")
        runners = {"a": self.study_a, "b": lambda st: self.study_iso("b", st),
                   "c": lambda st: self.study_iso("c", st), "d": self.study_d, "e": self.study_e}
        for study in STUDIES:
            if study not in only:
                continue
            d = self.study_dir(study)
            print("\n== study %s: %s -> %s" % (study, self.spec[study]["title"], d), flush=True)
            if not self.args.force and self.is_complete(study):
                print("  complete (skipped; --force reruns it)")
                continue
            if not self.args.dry_run:
                os.makedirs(d, exist_ok=True)
            state = {"key": self.key(study), "done": {}} if self.args.force else self.load_state(study)
            if self.args.force and not self.args.dry_run:
                self.args_force_cleanup(study)
            n_fail = len(self.failures)
            t0 = time.monotonic()
            try:
                runners[study](state)
            except BudgetReached as e:
                print("\nbudget reached: %s. Finished sub-runs are kept; rerun the same command "
                      "to go on." % e, flush=True)
                self.report()
                return 3
            if not self.args.dry_run and len(self.failures) == n_fail:
                write_json(os.path.join(d, COMPLETE), {
                    "key": self.key(study), "completed": now_iso(),
                    "driver_seconds": round(time.monotonic() - t0, 1),
                    "sub_runs": sorted(state["done"]),
                })
        print("\n== report")
        self.report()
        if self.args.dry_run:
            self.print_estimate()
        if self.failures:
            print("\n%d failure(s):" % len(self.failures), file=sys.stderr)
            for f in self.failures:
                print("  - " + f.replace("\n", "\n    "), file=sys.stderr)
            return 1
        return 0

    def args_force_cleanup(self, study):
        for name in (COMPLETE, STATE):
            p = os.path.join(self.study_dir(study), name)
            if os.path.exists(p):
                os.remove(p)


def find_isolane(given):
    if given:
        return os.path.abspath(given)
    for rel in ("stage/isolane", "target/release/isolane"):
        p = os.path.join(REPO, rel)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    found = shutil.which("isolane")
    if found:
        return found
    sys.exit("reproduce.py: no isolane binary (looked for stage/isolane, target/release/isolane "
             "and PATH); build it with `cargo build --release` or give --isolane PATH")


def main():
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `reproduce.py --dry-run | head` ends quietly
    ap = argparse.ArgumentParser(
        description="Reproduce papers 000 and 001's studies with isolane (see scenarios/papers/README.md).")
    ap.add_argument("--out", default=os.path.join("results", "h100"),
                    help="results root: one folder per study (default: results/h100)")
    ap.add_argument("--only", default=",".join(STUDIES),
                    help="studies to run, e.g. a,b (default: a,b,c,d,e)")
    ap.add_argument("--isolane", help="isolane binary (default: stage/isolane, then target/release/isolane)")
    ap.add_argument("--scale", default="quick", choices=["quick", "paper", "brief", "tiny"],
                    help="paper: N=1000, K=3, step 1 Hz as paper 000; quick: N=200, K=2, short "
                         "ramps (default); brief: N=100, K=1, fewer sizes, fits one device "
                         "session; tiny: CI only")
    ap.add_argument("--backend", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: a stand-in that swaps every model for a spin: equivalent")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the commands, write the generated scenarios (with assumed IMS values "
                         "where study a has not run), check them with isolane plan, print the time estimate")
    ap.add_argument("--ims", help="(--dry-run) JSON {model: {config: hz}} of IMS values to assume")
    ap.add_argument("--device-model", help="isolane plan/sweep --device-model (default: this "
                    "machine's GPU; h100-sxm in --dry-run and on the cpu stand-in)")
    ap.add_argument("--precision", help="precision of studies a-d (default: studies.json, fp32); e is fp16")
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--first-cpu", type=int, default=2,
                    help="cuda: pin workload i to core FIRST_CPU + i (default 2)")
    ap.add_argument("--no-pin", dest="pin", action="store_false", help="cuda: do not pin workloads to cores")
    ap.add_argument("--force", action="store_true", help="rerun studies even if complete")
    ap.add_argument("--budget-s", type=float,
                    help="start no sub-run whose estimated time would end past this many seconds "
                         "from now; then draw the report and exit 3 (rerun to go on)")
    ap.add_argument("--victim-load", type=float, default=1.0, metavar="F",
                    help="b, c: release the victims at F x their IMS (0 < F <= 1; default 1, the "
                         "papers' protocol: no slack); deadline = their period, the interferer still "
                         "ramps to its full IMS. Use another --out: results of another load do not mix")
    ap.add_argument("--studies", default=os.path.join(HERE, "studies.json"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not (0.0 < args.victim_load <= 1.0):
        ap.error("--victim-load: %s is outside 0 < F <= 1 (e.g. 0.95 for 5 %% below the IMS)" % args.victim_load)

    only = set(s.strip() for s in args.only.split(",") if s.strip())
    bad = only - set(STUDIES)
    if bad or not only:
        ap.error("--only: unknown study %s (studies: a,b,c,d,e)" % ",".join(sorted(bad)))
    if args.backend == "cpu" and args.precision not in (None, "fp32"):
        ap.error("--precision: the cpu backend runs fp32 only")
    if args.ims and not args.dry_run:
        ap.error("--ims is for --dry-run only: real runs take the IMS measured by study a")
    spec = read_json(args.studies)
    args.isolane = find_isolane(args.isolane)
    if args.dry_run and args.device_model is None and args.backend == "cuda":
        args.device_model = spec["device_model"]
    d = Driver(args, spec)
    print("isolane: %s\nresults: %s\nscale %s, backend %s%s"
          % (args.isolane, d.out, args.scale, args.backend, ", DRY RUN" if args.dry_run else ""))
    try:
        return d.main(only)
    except KeyboardInterrupt:
        print("\ninterrupted: finished sub-runs are kept; rerun the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
