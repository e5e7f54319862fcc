#!/usr/bin/env python3
"""A markdown digest of a results root written by reproduce.py (papers 000 and 001's studies).

    python3 scenarios/papers/digest.py results/h100 [--out results/h100/digest.md]

One section per study found (a-maxrate, b-isolation-2, c-isolation-4, d-partition-sweep,
e-concurrency-sweep); a study that is absent or incomplete is said to be so, and whatever it
holds is still shown. Missing fields print as "-". The papers' own numbers that a study is
compared with (paper 000 Tables II-III) are printed next to ours, labelled as the paper's.

Exit codes: 0 the digest was written (whatever it could read); 2 RESULTS_ROOT does not exist
or is not a folder, or bad arguments. Python >= 3.7, standard library only.
"""

import argparse
import csv
import datetime
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from reproduce import FOLDERS, STUDIES  # noqa: E402  (one list of studies and their folders)
TITLES = {
    "a": "max stable inference rate (IMS, Algorithm 1)",
    "b": "isolation, 2 workloads (victim at its IMS, interferer ramps)",
    "c": "isolation, 4 workloads (3 victims at their IMS, 1 interferer ramps)",
    "d": "partition sweep of one model alone, closed loop",
    "e": "concurrency x batch sweep, closed loop",
}
PAPER_REF = {
    "a": "paper 000 Tables II-III",
    "b": "paper 000 Figs. 8-10",
    "c": "paper 000 Fig. 11",
    "d": "paper 000 Figs. 4-5",
    "e": "paper 001 Figs. 6-7",
}
# Defaults when studies.json cannot be read (they are its values).
DEFAULT_MODELS_A = ["convnext_base", "convnext_large", "mobilenet_v2", "resnet18", "vit_b_16", "vit_l_32"]
CONFIG_ORDER = ["timeslice", "mps50", "green64", "green32", "green16", "green8", "mps25"]
DEFAULT_LABELS = {
    "timeslice": "timeslice (whole GPU)", "mps50": "mps 50 %", "mps25": "mps 25 %",
    "green64": "green 64 SMs", "green32": "green 32 SMs", "green16": "green 16 SMs",
    "green8": "green 8 SMs",
}
MECH_ORDER = ["timeslice", "mps", "green"]
DEVICE_SMS = 132

# Paper 000's IMS tables (Hz), quoted for comparison; never results of ours.
# Table II: NVIDIA A100 40 GB, PyTorch 2.4.1 (CUDA 12.1): GPU stand-alone, MPS, MIG 3g.20gb.
PAPER_A100 = {
    "convnext_base": (61, 61, 54), "convnext_large": (52, 52, 52), "mobilenet_v2": (147, 147, 123),
    "resnet18": (129, 129, 118), "vit_b_16": (95, 95, 76), "vit_l_32": (55, 55, 55),
}
# Table III: Jetson Orin Nano, TensorRT engines (JetPack 6.2): GPU stand-alone, MPS, GC 4 SMs.
PAPER_ORIN = {
    "convnext_base": (58, 58, 35), "convnext_large": (33, 33, 18), "mobilenet_v2": (134, 134, 79),
    "resnet18": (127, 127, 70), "vit_b_16": (58, 58, 36), "vit_l_32": (42, 42, 24),
}


# ------------------------------------------------------------------------------ helpers

def read_json(path):
    """The JSON value of a file, or None where it is missing or unreadable."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def get(d, *keys):
    """d[k1][k2]... or None where any level is missing (lists take int keys)."""
    for k in keys:
        if isinstance(d, dict):
            d = d.get(k)
        elif isinstance(d, (list, tuple)) and isinstance(k, int) and -len(d) <= k < len(d):
            d = d[k]
        else:
            return None
    return d


def num(v):
    """v as a finite float, or None."""
    if isinstance(v, bool) or v is None:
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def f(v, digits=1):
    x = num(v)
    return "-" if x is None else "%.*f" % (digits, x)


def ratio(a, b, digits=2):
    a, b = num(a), num(b)
    if a is None or b is None or b == 0:
        return "-"
    return "%.*f" % (digits, a / b)


def mean(xs):
    xs = [x for x in (num(v) for v in xs) if x is not None]
    return sum(xs) / len(xs) if xs else None


def maxn(xs):
    xs = [x for x in (num(v) for v in xs) if x is not None]
    return max(xs) if xs else None


def subdirs(d):
    try:
        names = sorted(os.listdir(d))
    except OSError:
        return []
    return [n for n in names if os.path.isdir(os.path.join(d, n)) and n not in ("logs", "scenarios")]


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for r in rows:
        out.append("| " + " | ".join(str(c) for c in r) + " |")
    return out


def load_spec():
    spec = read_json(os.path.join(HERE, "studies.json"))
    return spec if isinstance(spec, dict) else {}


# ------------------------------------------------------------------------------ the digest

class Digest:
    def __init__(self, root, spec):
        self.root = root
        self.spec = spec
        self.lines = []
        self.status = {}
        self.keys = {}
        self.devices = set()
        self.versions = set()
        self.sms = int(num(spec.get("device_sms")) or DEVICE_SMS)

    def w(self, *lines):
        self.lines.extend(lines)

    def labels(self):
        cfgs = self.spec.get("configs")
        if isinstance(cfgs, dict):
            return {k: (v.get("label") if isinstance(v, dict) else None) or k for k, v in cfgs.items()}
        return dict(DEFAULT_LABELS)

    # ---------------------------------------------------------------- study status

    def study_status(self, s):
        """(state, key, detail): state is complete / incomplete / absent."""
        d = os.path.join(self.root, FOLDERS[s])
        if not os.path.isdir(d):
            return "absent", None, "no %s/ folder" % FOLDERS[s]
        comp = read_json(os.path.join(d, "COMPLETE.json"))
        state = read_json(os.path.join(d, "state.json"))
        key = get(comp, "key") or get(state, "key")
        done = get(state, "done")
        n_done = len(done) if isinstance(done, dict) else None
        if isinstance(comp, dict):
            subs = comp.get("sub_runs")
            return "complete", key, "%s sub-runs, completed %s" % (
                len(subs) if isinstance(subs, list) else "?", comp.get("completed", "-"))
        if n_done is not None:
            return "incomplete", key, "%d sub-runs done, no COMPLETE.json" % n_done
        return "incomplete", key, "no COMPLETE.json or state.json"

    def header(self):
        for s in STUDIES:
            self.status[s] = self.study_status(s)
            self.keys[s] = self.status[s][1] or {}
        backends = sorted(set(str(k.get("backend")) for k in self.keys.values() if k.get("backend")))
        scales = sorted(set(str(k.get("scale")) for k in self.keys.values() if k.get("scale")))
        precisions = sorted(set(str(k.get("precision")) for k in self.keys.values() if k.get("precision")))
        self.w("# Digest of %s" % self.root, "",
               "Written by `scenarios/papers/digest.py` on %s from the files of the results root "
               "(reproduce.py's output). Paper values quoted below are the papers', labelled so; "
               "every other number is read from this results root."
               % datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "")
        self.w("- backend: **%s**" % (", ".join(backends) or "-"),
               "- scale: **%s**" % (", ".join(scales) or "-"),
               "- precision (studies' keys; study e runs fp16 on cuda, see its section): %s"
               % (", ".join(precisions) or "-"))
        if "cpu" in backends:
            self.w("", "> **WARNING: backend `cpu` — the CPU stand-in.** Every model was replaced by a "
                   "`spin:` busy-wait and nothing was partitioned (the mechanisms only label the "
                   "folders). These numbers test the pipeline; they mean nothing about any GPU or "
                   "about the papers' findings.")
        if len(scales) > 1 or len(backends) > 1:
            self.w("", "> Note: the studies were run at different scales or backends; compare them "
                   "with care.")
        self.w("")
        rows = []
        for s in STUDIES:
            st, key, detail = self.status[s]
            key = key or {}
            rows.append([s, FOLDERS[s], st, key.get("scale", "-"), key.get("backend", "-"),
                         key.get("precision", "-"), detail])
        self.w(*table(["study", "folder", "status", "scale", "backend", "precision", "detail"], rows))
        self.w("")
        self.commands()

    def commands(self):
        p = os.path.join(self.root, "commands.txt")
        try:
            with open(p) as fh:
                lines = [l.rstrip("\n") for l in fh if l.strip() and not l.startswith("#")]
        except OSError:
            self.w("commands.txt: absent.", "")
            return
        failed = [l for l in lines if "\trc=" in l and "\trc=0\t" not in l]
        total = 0.0
        for l in lines:
            parts = l.split("\t")
            if len(parts) > 1 and parts[1].strip().endswith("s"):
                total += num(parts[1].strip()[:-1]) or 0.0
        self.w("commands.txt: %d commands, %.0f s of command time in all, %d with a non-zero exit code%s"
               % (len(lines), total, len(failed), ":" if failed else "."))
        for l in failed[:20]:
            parts = l.split("\t")
            self.w("- `%s`" % " ".join(p.strip() for p in parts[:4])[:300])
        if len(failed) > 20:
            self.w("- ... and %d more" % (len(failed) - 20))
        self.w("")

    def section_head(self, s):
        st, key, detail = self.status[s]
        self.w("## %s. %s (%s)" % (s, TITLES[s], PAPER_REF[s]), "")
        self.w("Folder `%s/`: **%s** (%s)." % (FOLDERS[s], st, detail))
        if st == "incomplete":
            self.w("", "> Study %s is incomplete: what is below is what it has so far; missing "
                   "runs show as `-` or are not listed." % s)
        self.w("")

    # ---------------------------------------------------------------- a: IMS

    def study_a(self):
        self.section_head("a")
        d = os.path.join(self.root, FOLDERS["a"])
        ims = {}      # model -> config -> (hz, l_max_ms)
        extra = {}    # model -> config -> maxrate.json
        for name in subdirs(d):
            if "-" not in name:
                continue
            model, config = name.rsplit("-", 1)
            r = read_json(os.path.join(d, name, "maxrate.json"))
            if not isinstance(r, dict):
                continue
            hz = num(r.get("max_rate_hz"))
            lmax = num(r.get("l_max_ms"))
            if lmax is None and hz:
                lmax = 1e3 / hz
            ims.setdefault(model, {})[config] = (hz, lmax)
            extra.setdefault(model, {})[config] = r
            if r.get("isolane_version"):
                self.versions.add(str(r["isolane_version"]))
        # Fall back on ims.json for what has no folder.
        tab = read_json(os.path.join(d, "ims.json"))
        if isinstance(tab, dict):
            for model, cfgs in tab.items():
                if not isinstance(cfgs, dict):
                    continue
                for config, v in cfgs.items():
                    if config not in ims.get(model, {}):
                        ims.setdefault(model, {})[config] = (num(get(v, "max_rate_hz")), num(get(v, "l_max_ms")))
        if not ims:
            self.w("No maxrate.json or ims.json found: nothing measured yet.", "")
            return
        models = []
        for g in get(self.spec, "a", "runs") or []:
            for m in g.get("models", []) if isinstance(g, dict) else []:
                if m not in models:
                    models.append(m)
        models = [m for m in (models or DEFAULT_MODELS_A) if m in ims] + sorted(m for m in ims if m not in models)
        configs = [c for c in CONFIG_ORDER if any(c in ims[m] for m in models)]
        configs += sorted(set(c for m in models for c in ims[m]) - set(configs))
        labels = self.labels()
        self.w("Configs: " + "; ".join("`%s` = %s" % (c, labels.get(c, c)) for c in configs) + ". "
               "`timeslice` is `isolane maxrate --mechanism none` (the whole GPU, no partition).", "")
        self.w("### IMS (Hz)", "")
        self.w(*table(["model"] + configs, [[m] + [f(get(ims[m], c, 0)) for c in configs] for m in models]))
        self.w("", "### L_max (ms) = 1 / IMS: the deadline (period) a victim at its IMS has", "")
        self.w(*table(["model"] + configs, [[m] + [f(get(ims[m], c, 1), 3) for c in configs] for m in models]))
        stand = sorted(set(str(get(extra, m, c, "model")) for m in extra for c in extra[m]
                           if str(get(extra, m, c, "model")) not in ("None", m)))
        if stand:
            self.w("", "Models actually timed (stand-ins): " + ", ".join("`%s`" % s for s in stand[:12])
                   + (" ..." if len(stand) > 12 else ""))
        lat = []
        for m in models:
            for c in configs:
                r = get(extra, m, c)
                if r is None:
                    continue
                trace = r.get("trace") if isinstance(r.get("trace"), list) else []
                lat.append([m, c, r.get("mechanism", "-"), r.get("sms") if r.get("sms") is not None else "-",
                            r.get("thread_pct") if r.get("thread_pct") is not None else "-",
                            f(r.get("initial_rate_hz")), f(r.get("max_rate_hz")), len(trace),
                            f(get(r, "start_lateness_us", "p99"))])
        if lat:
            self.w("", "<details><summary>per run: mechanism, partition, initial estimate, batches "
                   "timed, start lateness</summary>", "")
            self.w(*table(["model", "config", "mechanism", "sms", "thread %", "initial Hz", "IMS Hz",
                           "batches", "start lateness p99 us"], lat))
            self.w("", "</details>")

        self.w("", "### Ratios the paper discusses", "",
               "Ours against the whole GPU (`timeslice`), next to paper 000's own ratios "
               "(Table II, A100/PyTorch: MIG 3g.20gb / stand-alone; Table III, Orin Nano/TensorRT: "
               "GC 4 SMs / stand-alone; in both tables MPS = stand-alone). green 64 SMs is %.0f %% "
               "of the H100's %d SMs; MIG 3g.20gb is 3 of the A100's 7 GPC slices (42 of its 108 SMs); GC 4 SMs is "
               "half of the Orin Nano's 8." % (100.0 * 64 / self.sms, self.sms), "")
        rows = []
        for m in models:
            t = get(ims[m], "timeslice", 0)
            pa, po = PAPER_A100.get(m), PAPER_ORIN.get(m)
            rows.append([m, ratio(get(ims[m], "green64", 0), t), ratio(get(ims[m], "mps50", 0), t),
                         ratio(get(ims[m], "mps25", 0), t),
                         ratio(pa[2], pa[0]) if pa else "-", ratio(po[2], po[0]) if po else "-"])
        self.w(*table(["model", "green 64 / whole", "mps 50 % / whole", "mps 25 % / whole",
                       "paper A100 MIG 3g / whole", "paper Orin GC 4 SMs / whole"], rows))
        self.w("", "Scaling with the SM share: IMS of green N SMs over green 64 SMs, against N / 64. "
               "Equal to N / 64: the IMS is proportional to the SMs (paper 000 on the Orin Nano: \"a "
               "more linear decrease\"); above it: the model loses less than its share of SMs (paper "
               "000 on the A100: convnext_large and vit_l_32 kept their IMS on MIG 3g.20gb).", "")
        greens = [c for c in ("green8", "green16", "green32", "green64") if c in configs]
        small = [c for c in greens if c != "green64"]
        rows = []
        for m in models:
            g64 = get(ims[m], "green64", 0)
            rows.append([m] + [ratio(get(ims[m], c, 0), g64) for c in small]
                        + [ratio(get(ims[m], c, 0), get(ims[m], "timeslice", 0)) for c in greens])
        self.w(*table(["model"] + ["%s / green64 (share %.3f)" % (c, int(c[5:]) / 64.0) for c in small]
                      + ["%s / whole (SMs %.3f)" % (c, int(c[5:]) / float(self.sms)) for c in greens], rows))
        self.w("", "Paper 000's IMS values (Hz) for reference (not ours):", "")
        rows = [[m] + list(PAPER_A100.get(m, ("-",) * 3)) + list(PAPER_ORIN.get(m, ("-",) * 3)) for m in models
                if m in PAPER_A100]
        self.w(*table(["model", "A100 stand-alone", "A100 MPS", "A100 MIG 3g.20gb", "Orin Nano stand-alone",
                       "Orin Nano MPS", "Orin Nano GC 4 SMs"], rows))
        self.w("")

    # ---------------------------------------------------------------- b, c: isolation

    def iso_run(self, run_dir):
        """dict: steps [(interferer Hz, [victim timeout %], [victim p99 ms])], victims' IMS and
        deadline, whole-run timeout % per role, status; None if nothing readable."""
        s = read_json(os.path.join(run_dir, "summary.json"))
        res = {"steps": [], "victim_rate": None, "deadline_ms": None, "victim_to": None,
               "interferer_to": None, "status": "-", "victim_p99": None, "starts_s": [],
               "dir": run_dir}
        if isinstance(s, dict):
            res["status"] = s.get("status", "-")
            if s.get("interrupted"):
                res["status"] = "%s (interrupted)" % res["status"]
            if s.get("isolane_version"):
                self.versions.add(str(s["isolane_version"]))
            dev = get(s, "telemetry", "device")
            if dev:
                self.devices.add(str(dev))
            for st in s.get("steps") or []:
                vs = st.get("victims") if isinstance(st, dict) and isinstance(st.get("victims"), list) else []
                res["starts_s"].append(num(get(st, "start_s")))
                res["steps"].append((num(get(st, "interferer_rate_hz")),
                                     [get(v, "timeout_pct") for v in vs],
                                     [get(v, "latency_ms", "p99") for v in vs]))
            vics, ints = [], []
            for wl in s.get("workloads") or []:
                if not isinstance(wl, dict):
                    continue
                is_victim = str(wl.get("name", "")).startswith("victim") or wl.get("role") == "victim"
                (vics if is_victim else ints).append(wl)
            res["victim_rate"] = mean(v.get("rate_hz") for v in vics)
            res["deadline_ms"] = mean(v.get("deadline_ms") for v in vics)
            res["victim_to"] = mean(v.get("timeout_pct") for v in vics)
            res["victim_p99"] = maxn(get(v, "latency_ms", "p99") for v in vics)
            res["interferer_to"] = mean(v.get("timeout_pct") for v in ints)
            t = s.get("telemetry") if isinstance(s.get("telemetry"), dict) else None
            if t is not None:
                thr = t.get("throttle_reasons")
                res["telemetry"] = [f(get(t, "power_w", "mean")), f(get(t, "power_w", "max")),
                                    f(get(t, "sm_clock_mhz", "min"), 0), f(get(t, "sm_clock_mhz", "max"), 0),
                                    f(get(t, "temperature_c", "max"), 0),
                                    ", ".join(str(x) for x in thr) if isinstance(thr, list) and thr else "none"]
        if not res["steps"]:
            # isolation.csv: one row per step and victim.
            try:
                with open(os.path.join(run_dir, "isolation.csv")) as fh:
                    by = {}
                    for row in csv.DictReader(fh):
                        k = row.get("step")
                        e = by.setdefault(k, (num(row.get("interferer_rate_hz")), [], []))
                        e[1].append(row.get("timeout_pct"))
                        e[2].append(row.get("p99_ms"))
                    res["steps"] = [by[k] for k in sorted(by, key=lambda x: num(x) or 0)]
            except OSError:
                pass
        if not isinstance(s, dict) and not res["steps"]:
            return None
        return res

    def study_iso(self, study):
        self.section_head(study)
        d = os.path.join(self.root, FOLDERS[study])
        runs = {}  # model -> mech -> result
        for name in subdirs(d):
            parts = name.rsplit("-", 2)
            if len(parts) != 3:
                continue
            model, mech, _ = parts
            r = self.iso_run(os.path.join(d, name))
            if r is not None:
                runs.setdefault(model, {})[mech] = r
        if not runs:
            self.w("No isolation run folder with summary.json or isolation.csv: nothing measured yet.", "")
            return
        nv = "the victim" if study == "b" else "the 3 victims (mean; max in brackets)"
        smodels = get(self.spec, study, "models") or []
        models = [m for m in smodels if m in runs] + sorted(m for m in runs if m not in smodels)
        mechs = [m for m in MECH_ORDER if any(m in runs[x] for x in models)]
        mechs += sorted(set(k for x in models for k in runs[x]) - set(mechs))
        cfgs = get(self.spec, study, "mechanisms") or {}
        labels = self.labels()
        self.w("Partitions: " + "; ".join("%s = %s" % (m, labels.get(cfgs.get(m), cfgs.get(m, "?"))) for m in mechs)
               + ". Deadline of a victim = its period (1 / its IMS from study a). Timeout %% of %s per "
               "interferer step; the interferer ramps from 1 Hz to its own IMS (same model, same "
               "partition size)." % nv, "")
        load = get(self.status[study][1] or {}, "victim_load")
        if load is not None:
            self.w("**Victims with slack** (`reproduce.py --victim-load %s`): the victims are released "
                   "at %s x their IMS, so their deadline (their period) is %.1f %% longer than the IMS "
                   "period; the interferer still ramps to its full IMS. The papers' protocol is load 1."
                   % (load, load, (1.0 / num(load) - 1.0) * 100.0 if num(load) else float("nan")), "")
        self.w("### Headline: largest victim timeout % over the ramp", "")
        rows = []
        for m in models:
            for mech in mechs:
                r = runs[m].get(mech)
                if r is None:
                    rows.append([m, mech, "-", "-", "-", "-", "-", "-", "-", "not run"])
                    continue
                worst, at, first, worst1 = None, None, None, None
                for i, (hz, tos, _) in enumerate(r["steps"]):
                    v, v1 = mean(tos), maxn(tos)
                    if i == 0:
                        first = (v, v1)
                    if v is not None and (worst is None or v > worst):
                        worst, at = v, hz
                    if v1 is not None and (worst1 is None or v1 > worst1):
                        worst1 = v1

                def mm(a, b):
                    return f(a, 2) if study == "b" else "%s [%s]" % (f(a, 2), f(b, 2))

                rows.append([m, mech, f(r["victim_rate"]), f(r["deadline_ms"], 3),
                             mm(*(first or (None, None))), mm(worst, worst1),
                             f(at), f(r["victim_to"], 2), f(r["victim_p99"], 3),
                             "%s; interferer timeout %% %s" % (r["status"], f(r["interferer_to"], 1))])
        if study != "b":
            self.w("Timeout % cells: mean over the 3 victims (paper 000 Fig. 11 plots that mean), "
                   "[the worst single victim] in brackets.", "")
        self.w(*table(["model", "mechanism", "victim rate Hz", "deadline ms", "timeout % at 1 Hz",
                       "max timeout % over the ramp", "at interferer Hz", "victim timeout % (whole run)",
                       "victim p99 ms (whole run)", "status"], rows))
        tel = [[m, mech] + runs[m][mech]["telemetry"] for m in models for mech in mechs
               if runs[m].get(mech) and runs[m][mech].get("telemetry")]
        self.w("", "### Device telemetry over each run (paper 000 Figs. 6-7: power, clock, temperature)", "")
        if tel:
            self.w(*table(["model", "mechanism", "power W mean", "power W max", "SM clock MHz min",
                           "SM clock MHz max", "temperature C max", "throttle reasons seen"], tel))
        else:
            self.w("No `telemetry` in these runs' summary.json (it exists on backend cuda with NVML only).")
        self.w("", "### Per step", "")
        for m in models:
            n = max(len(runs[m][k]["steps"]) for k in runs[m])
            hdr = ["step"]
            for mech in mechs:
                hdr += ["%s interferer Hz" % mech, "%s timeout %%" % mech, "%s p99 ms" % mech]
            rows = []
            for i in range(n):
                row = [str(i)]
                for mech in mechs:
                    st = get(runs[m], mech, "steps")
                    if not st or i >= len(st):
                        row += ["-", "-", "-"]
                        continue
                    hz, tos, p99s = st[i]
                    if study == "b" or len(tos) <= 1:
                        to, p = f(mean(tos), 2), f(maxn(p99s), 3)
                    else:
                        to = "%s [%s]" % (f(mean(tos), 2), f(maxn(tos), 2))
                        p = "%s [%s]" % (f(mean(p99s), 3), f(maxn(p99s), 3))
                    row += [f(hz), to, p]
                rows.append(row)
            self.w("**%s**" % m, "")
            self.w(*table(hdr, rows))
            self.w("")
        self.iso_exec_section(runs, models, mechs)

    @staticmethod
    def victim_exec_ms(r):
        """Per step: the victims' median execution time (end - start of each job, ms; the mean
        over the victims of each one's median), from jobs/victim*.csv. None if absent."""
        starts = r.get("starts_s") or []
        jobs = os.path.join(r.get("dir") or "", "jobs")
        if not starts or any(x is None for x in starts) or not os.path.isdir(jobs):
            return None
        per_victim = []
        for name in sorted(os.listdir(jobs)):
            if not (name.startswith("victim") and name.endswith(".csv")):
                continue
            steps = [[] for _ in starts]
            try:
                with open(os.path.join(jobs, name)) as fh:
                    for row in csv.DictReader(fh):
                        rel, a, b = num(row.get("release_ms")), num(row.get("start_ms")), num(row.get("end_ms"))
                        if rel is None or a is None or b is None:
                            continue
                        k = max(i for i, t0 in enumerate(starts) if i == 0 or rel / 1000.0 >= t0)
                        steps[k].append(b - a)
            except OSError:
                continue
            per_victim.append([sorted(x)[len(x) // 2] if x else None for x in steps])
        if not per_victim:
            return None
        return [mean(col) for col in zip(*per_victim)]

    def iso_exec_section(self, runs, models, mechs):
        rows = []
        for m in models:
            for mech in mechs:
                r = runs[m].get(mech)
                ex = self.victim_exec_ms(r) if r else None
                if not ex:
                    continue
                dl = r.get("deadline_ms")
                over = [str(i) for i, x in enumerate(ex) if x is not None and dl is not None and x > dl]
                rows.append([m, mech, f(dl, 3)] + [f(x, 3) for x in ex]
                            + [ratio(ex[-1], ex[0]), ", ".join(over) or "none"])
        if not rows:
            return
        n = max(len(r) for r in rows) - 5
        self.w("### Victim execution time per step (from jobs/*.csv)", "",
               "What the interferer does to the victim's own work: the median time from a job's start "
               "to its end (ms; mean over the victims), per ramp step. A victim released at its IMS has "
               "no slack: once this passes the deadline, jobs queue and time out even though the "
               "slowdown is small, so this shows the isolation that the timeout % hides.", "")
        self.w(*table(["model", "mechanism", "deadline ms"] + ["step %d" % i for i in range(n)]
                      + ["last / first", "steps over the deadline"], rows))
        self.w("")

    # ---------------------------------------------------------------- d, e: sweeps

    def point(self, sweep_dir, p):
        """One sweep point's summary.json as a flat dict (None where missing)."""
        s = read_json(os.path.join(sweep_dir, str(p.get("dir", "")), "summary.json")) if isinstance(p, dict) else None
        wls = [w for w in (get(s, "workloads") or []) if isinstance(w, dict)]
        if s is not None and get(s, "telemetry", "device"):
            self.devices.add(str(get(s, "telemetry", "device")))
        tput = [num(w.get("throughput_ips")) for w in wls]
        mems = [num(w.get("gpu_memory_mib")) for w in wls]
        return {
            "ok": s is not None,
            "n": len(wls),
            "tput_sum": sum(x for x in tput if x is not None) if any(x is not None for x in tput) else None,
            "tput_per": mean(tput),
            "mean_ms": mean(get(w, "latency_ms", "mean") for w in wls),
            "p50_ms": mean(get(w, "latency_ms", "p50") for w in wls),
            "p99_ms": maxn(get(w, "latency_ms", "p99") for w in wls),
            "mem_proc": sum(x for x in mems if x is not None) if any(x is not None for x in mems) else None,
            "mem_dev": get(s, "telemetry", "memory_used_mib", "max"),
            "power": get(s, "telemetry", "power_w", "mean"),
            "energy": get(s, "telemetry", "energy_j"),
            "j_img": mean(w.get("j_per_image") for w in wls),
            "status": (p.get("status") if isinstance(p, dict) else None) or get(s, "status") or "-",
        }

    def sweeps(self, study):
        d = os.path.join(self.root, FOLDERS[study])
        found = []
        for name in subdirs(d):
            sw = read_json(os.path.join(d, name, "sweep.json"))
            if isinstance(sw, dict):
                found.append((name, os.path.join(d, name), sw))
        return found

    def study_d(self):
        self.section_head("d")
        found = self.sweeps("d")
        if not found:
            self.w("No sweep folder with sweep.json: nothing measured yet.", "")
            return
        self.w("Throughput and latency are the workload's (closed loop, batch 1); memory: the "
               "process's peak device memory (`gpu_memory_mib`) and the device's peak "
               "(`telemetry.memory_used_mib.max`); power: mean over the run (`telemetry.power_w`). "
               "Telemetry exists only on cuda. \"x full\" = throughput over the largest size's; "
               "share = SMs / %d or thread %% / 100." % self.sms, "")
        # The unpartitioned baseline: a one-point concurrency sweep (reproduce.py's <model>-whole).
        whole = None
        for name, sd, sw in found:
            if sw.get("kind") == "concurrency":
                pts = [p for p in (sw.get("points") or []) if isinstance(p, dict)]
                if pts:
                    whole = (name, self.point(sd, pts[0]))
        if whole is not None:
            x = whole[1]
            self.w("**Unpartitioned baseline** (`%s`: the model alone on the whole GPU, one process, "
                   "no partition): throughput %s img/s, mean %s ms, p99 %s ms, process %s MiB, "
                   "device %s MiB, power %s W, %s J/image, status %s. \"x whole\" below = "
                   "throughput over this." % (
                       whole[0], f(x["tput_sum"]), f(x["mean_ms"], 3), f(x["p99_ms"], 3),
                       f(x["mem_proc"], 0), f(x["mem_dev"], 0), f(x["power"]), f(x["j_img"], 3),
                       x["status"] if x["ok"] else "%s (no summary)" % x["status"]), "")
        base = whole[1]["tput_sum"] if whole is not None else None
        for name, sd, sw in found:
            if sw.get("kind") == "concurrency":
                continue
            mech = sw.get("mechanism", "-")
            unit = str(sw.get("unit") or ("sms" if mech == "green" else "thread_pct"))
            pts = [p for p in (sw.get("points") or []) if isinstance(p, dict)]
            pts.sort(key=lambda p: num(p.get(unit)) or 0)
            data = [(p, self.point(sd, p)) for p in pts]
            full = data[-1][1]["tput_sum"] if data else None
            self.w("### %s: %s, model `%s`, %s %s, partition applied: %s" % (
                name, mech, sw.get("model", "-"), sw.get("backend", "-"),
                ", ".join(sorted(set(str(p.get("precision")) for p in pts if p.get("precision")))) or "-",
                sw.get("partition_applied", "-")), "")
            rows = []
            for p, x in data:
                size = num(p.get(unit))
                share = None if size is None else (size / self.sms if unit == "sms" else size / 100.0)
                rows.append([f(size, 0), f(share, 3), f(x["tput_sum"]), ratio(x["tput_sum"], full),
                             ratio(x["tput_sum"], base),
                             f(x["mean_ms"], 3), f(x["p99_ms"], 3), f(x["mem_proc"], 0), f(x["mem_dev"], 0),
                             f(x["power"]), f(x["j_img"], 3), x["status"] if x["ok"] else "%s (no summary)" % x["status"]])
            self.w(*table([unit, "share", "throughput img/s", "x full", "x whole", "mean ms", "p99 ms",
                           "process MiB", "device MiB", "power W", "J/image", "status"], rows))
            self.w("")

    def study_e(self):
        self.section_head("e")
        found = self.sweeps("e")
        if not found:
            self.w("No sweep folder with sweep.json: nothing measured yet.", "")
            return
        self.w("Each workload is its own process on the whole GPU (timeslice), closed loop. T/P = "
               "throughput per workload (images/s, the mean over the workloads: paper 001's "
               "metric); total = their sum; memory = the sum of the processes' peak device memory "
               "(device peak in brackets); power = mean device power (cuda only).", "")
        for name, sd, sw in found:
            pts = [p for p in (sw.get("points") or []) if isinstance(p, dict)]
            data = {}
            for p in pts:
                data[(num(p.get("workloads")), num(p.get("batch")))] = self.point(sd, p)
            wls = sorted(set(k[0] for k in data if k[0] is not None))
            bss = sorted(set(k[1] for k in data if k[1] is not None))
            self.w("### %s: model `%s`, %s %s" % (
                name, sw.get("model", "-"), sw.get("backend", "-"),
                ", ".join(sorted(set(str(p.get("precision")) for p in pts if p.get("precision")))) or "-"), "")
            if not wls or not bss:
                self.w("No point with a number of workloads and a batch size.", "")
                continue

            def grid(title, fn):
                self.w("%s:" % title, "")
                rows = [["%d" % w] + [fn(data.get((w, b))) if data.get((w, b)) else "-" for b in bss] for w in wls]
                self.w(*table(["workloads \\ batch"] + ["%d" % b for b in bss], rows))
                self.w("")

            grid("T/P, throughput per workload (img/s)", lambda x: f(x["tput_per"]))
            grid("Total throughput (img/s)", lambda x: f(x["tput_sum"]))
            grid("p99 latency per batch (ms, worst workload)", lambda x: f(x["p99_ms"], 3))
            grid("Memory (MiB: sum of process peaks [device peak])",
                 lambda x: "%s [%s]" % (f(x["mem_proc"], 0), f(x["mem_dev"], 0)))
            grid("Power (W, mean)", lambda x: f(x["power"]))
            bad = ["w%s b%s: %s%s" % (f(k[0], 0), f(k[1], 0), x["status"], "" if x["ok"] else " (no summary)")
                   for k, x in sorted(data.items(), key=lambda i: (i[0][0] or 0, i[0][1] or 0))
                   if not x["ok"] or x["status"] != "ok"]
            if bad:
                self.w("Points not ok: " + "; ".join(bad), "")

    # ---------------------------------------------------------------- all

    def run(self):
        self.header()
        runners = {"a": self.study_a, "b": lambda: self.study_iso("b"), "c": lambda: self.study_iso("c"),
                   "d": self.study_d, "e": self.study_e}
        for s in STUDIES:
            if self.status[s][0] == "absent":
                self.w("## %s. %s (%s)" % (s, TITLES[s], PAPER_REF[s]), "",
                       "Not present: %s." % self.status[s][2], "")
                continue
            n = len(self.lines)
            try:
                runners[s]()
            except Exception as e:  # never crash on a partial or odd results root
                self.w("", "> digest.py could not read all of study %s: %s: %s" % (s, type(e).__name__, e), "")
                if len(self.lines) == n:
                    self.w("")
        foot = []
        if self.devices:
            foot.append("devices (telemetry): " + ", ".join(sorted(self.devices)))
        if self.versions:
            foot.append("isolane versions: " + ", ".join(sorted(self.versions)))
        if foot:
            self.w("---", "", *["- " + x for x in foot])
            self.w("")
        return "\n".join(self.lines).rstrip() + "\n"


def main():
    ap = argparse.ArgumentParser(description="Markdown digest of a reproduce.py results root.")
    ap.add_argument("root", metavar="RESULTS_ROOT", help="results root written by reproduce.py (e.g. results/h100)")
    ap.add_argument("--out", metavar="FILE.md", help="write the digest here (default: standard output)")
    args = ap.parse_args()
    root = args.root
    if not os.path.isdir(root):
        print("digest.py: %s: no such results root (a folder written by "
              "scenarios/papers/reproduce.py)" % root, file=sys.stderr)
        return 2
    text = Digest(os.path.normpath(root), load_spec()).run()
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        tmp = args.out + ".tmp"
        with open(tmp, "w") as fh:
            fh.write(text)
        os.replace(tmp, args.out)
        print("digest: %s" % args.out, file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
