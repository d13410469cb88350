#!/usr/bin/env python3
"""Every pipeline schedule at PP 4 on CPU: the measured bubble (from
piper-run --trace), the simulated one (piper-plan --simulate with the
measured mean cost of each pass, free links) and the published formula with
the same costs, side by side. Called by bench/schedules.sh.

Usage: schedules.py PIPERC PIPER_PLAN PIPER_RUN FREE_MACHINE_JSON WORKDIR
"""
import json
import os
import re
import statistics
import subprocess
import sys

PIPERC, PIPER_PLAN, PIPER_RUN, MACHINE, WORK = sys.argv[1:6]
P = int(os.environ.get("PP", "4"))
M = int(os.environ.get("MICROBATCHES", "8"))
STEPS = int(os.environ.get("STEPS", "4"))
MODEL = os.environ.get(
    "MODEL", "gpt --layers 6 --hidden 256 --heads 4 --vocab 512 --seq 128 "
             "--batch 4").split()
SCHEDULES = ["gpipe", "1f1b", "zb-h1", "zb-h2", "interleaved-1f1b", "zbv",
             "dualpipe", "dualpipev"]


def run(cmd):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    if proc.returncode != 0:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), proc.stdout))
    return proc.stdout


def pass_costs(trace):
    """Mean seconds of each pass's CALLs over every rank of the traced step."""
    durations = {}
    for e in trace["traceEvents"]:
        if e.get("ph") != "X" or e.get("cat") != "CALL":
            continue
        m = re.search(r"PASS=(\w+)", e["name"])
        if m:
            durations.setdefault(m.group(1), []).append(e["dur"] * 1e-6)
    return {k: statistics.mean(v) for k, v in durations.items()}


def formula(schedule, c):
    """(bubble seconds, busy seconds) per device group by the published
    formula, with per-stage costs F, B (fused), BI (B_in) and W."""
    f, w = c["F"], c.get("BW", 0.0)
    b = c.get("B", c.get("BI", 0.0) + w)
    bi = c.get("BI", b - w)
    if schedule in ("gpipe", "1f1b"):
        return (P - 1) * (f + b), M * (f + b)
    if schedule == "zb-h1":
        return (P - 1) * (f + bi - w), M * (f + bi + w)
    if schedule == "zb-h2":
        return max(0.0, (P - 1) * (f + bi - 2 * w)), M * (f + bi + w)
    if schedule == "interleaved-1f1b":  # v = 2, per-stage costs
        return (P - 1) * (f + b), 2 * M * (f + b)
    # DualPipe: F&B is an overlapped pair; on CPU cores the pair shares the
    # cores, so F&B = F + B here.
    fb = f + b
    if schedule == "dualpipe":
        return (P / 2 - 1) * (fb + b - 3 * w), M * (f + b)
    if schedule == "dualpipev":  # DualPipe folded onto 2P stages
        return (P - 1) * (fb + b - 3 * w), 2 * M * (f + b)
    return None, None


def main():
    os.makedirs(WORK, exist_ok=True)
    model = os.path.join(WORK, "model.mlir")
    run([PIPERC, "model"] + MODEL + ["-o", model])
    rows = []
    for s in SCHEDULES:
        out = os.path.join(WORK, s)
        trace = os.path.join(WORK, s + ".trace.json")
        run([PIPERC, "compile", model, "--pp", str(P), "--microbatches",
             str(M), "--schedule", s, "-o", out])
        run([PIPER_RUN, out, "--nproc", str(P), "--backend", "cpu", "--steps",
             str(STEPS), "--trace", trace])
        with open(trace) as f:
            t = json.load(f)
        measured = statistics.mean(t["metadata"]["bubble_fraction"])
        costs = pass_costs(t)
        cmd = [PIPER_PLAN, out, "--simulate", "--machine", MACHINE, "--cost",
               "U=%g" % costs.get("U", 0.0)]
        for k in ("F", "B", "BI", "BW"):
            if k in costs:
                cmd += ["--cost", "%s=%g" % (k, costs[k])]
        sim = run(cmd)
        fractions = [float(x) / 100 for x in
                     re.findall(r"^class .*bubble ([0-9.]+)%", sim, re.M)]
        simulated = statistics.mean(fractions)
        bubble, busy = formula(s, costs)
        expected = (max(0.0, bubble) / (max(0.0, bubble) + busy)
                    if bubble is not None else None)
        rows.append((s, measured, simulated, expected, costs))
    print("PP %d, %d microbatches, %s; bubble = idle share of a rank's step "
          "(mean over ranks or classes)" % (P, M, " ".join(MODEL)))
    print("%-17s %9s %10s %8s %10s  %s" % ("schedule", "measured", "simulated",
                                          "formula", "meas/sim",
                                          "mean pass costs (ms)"))
    for s, meas, sim, exp, costs in rows:
        cost = " ".join("%s=%.2f" % (k, v * 1e3) for k, v in sorted(costs.items()))
        print("%-17s %8.1f%% %9.1f%% %8s %10s  %s" % (
            s, 100 * meas, 100 * sim,
            "%.1f%%" % (100 * exp) if exp is not None else "-",
            "%.2f" % (meas / sim) if sim > 0 else "n/a", cost))


if __name__ == "__main__":
    main()
