#!/usr/bin/env python3
"""The paper's composition on a simulated H200 node (bench/composition.sh).

For each model preset, PP x DP x EP with every schedule of the paper's
comparison, each with ZeRO 0, 1 and 3 (where the schedule takes it) and the
expert all-to-alls on their own stream, on the gradient reductions' stream
or on the compute stream, prints the simulator's step time and
bubble, the exact per-rank peak of the memory plan, and the largest
microbatch (sequences per microbatch) whose plans fit in the device memory.

The strategies are written as directives (JSON), so the stream of every
collective is the user's choice: "own" puts the all-to-alls on their own
"ep_stream" (the gradient reductions are on "dp_stream"), "shared" puts
them on "dp_stream" with the reductions, "serial" on the compute stream of
the task they belong to.

Usage: composition.py PIPERC PIPER_PLAN MACHINES WORK [MODEL...]
MACHINES: machine descriptions separated by commas; the first gives the
bubble, each a step time (bench/h200-node.json: one NVLink node;
bench/h200-ib.json: the same GPUs one per node, over InfiniBand).
"""
import json
import os
import re
import subprocess
import sys

PIPERC, PIPER_PLAN, MACHINES, WORK = sys.argv[1:5]
MACHINES = MACHINES.split(",")
MODELS = sys.argv[5:] or ["qwen3-moe-1b", "qwen3-moe-9b"]
PP, DP, EP = (int(os.environ.get(k, v)) for k, v in
              (("PP", "4"), ("DP", "2"), ("EP", "2")))
# Microbatches per replica: the fewest that every schedule here takes at
# PP 4 (dualpipe: an even number >= 2P; interleaved: a multiple of P).
MICROBATCHES = int(os.environ.get("MICROBATCHES", "8"))
# H200: nvidia-smi reports 143771 MiB (141 GB).
DEVICE_MEMORY = os.environ.get("DEVICE_MEMORY", "143771MiB")
SCHEDULES = ["1f1b", "interleaved-1f1b", "zbv", "dualpipev", "dualpipe"]
ZERO = [0, 1, 3]
V_LAYOUT = {"interleaved-1f1b": "interleaved", "zbv": "v", "dualpipev": "v"}


def group(g):
    return list(range(g * DP, (g + 1) * DP))


# The all-to-alls' stream, by the name the table gives it.
A2A = [("own", "ep_stream"), ("shared", "dp_stream"), ("serial", "compute")]


def strategy(schedule, zero, a2a):
    """The directives of PP x DP x EP under `schedule`, as piperc's flags
    write them, with the all-to-alls on stream `a2a`."""
    layout = V_LAYOUT.get(schedule, "linear")
    stages = PP * (1 if layout == "linear" else 2)
    ds = [{"op": "stage", "stages": stages},
          {"op": "split", "filter": {}, "dim_name": "MB",
           "num_microbatches": MICROBATCHES}]
    reps, shards = [], []

    def replicate(st, devices):
        if DP > 1:
            r = {"op": "replicate", "filter": {"PP": st}, "devices": devices,
                 "reduce_stream": "dp_stream"}
            if zero:
                r["zero"] = zero
                r["gather_stream"] = "gather_stream" if zero == 3 else "dp_stream"
            reps.append(r)

    for st in range(stages):
        if schedule == "dualpipe":
            copies = []
            for m in range(MICROBATCHES):
                g = st if 2 * m < MICROBATCHES else PP - 1 - st
                if g not in copies:
                    copies.append(g)
                ds.append({"op": "place", "filter": {"PP": st, "MB": m},
                           "devices": group(g), "stream": "pp_stream"})
            for g in copies:
                replicate(st, group(g))
            shards.append(sorted(sum((group(g) for g in copies), [])))
            continue
        if layout == "interleaved":
            g = st % PP
        elif layout == "v":
            g = st if st < PP else 2 * PP - 1 - st
        else:
            g = st
        ds.append({"op": "place", "filter": {"PP": st}, "devices": group(g),
                   "stream": "pp_stream"})
        replicate(st, group(g))
        shards.append(group(g))
    ds += reps
    if EP > 1:
        seen = []
        for devices in shards:
            if devices not in seen:
                seen.append(devices)
                ds.append({"op": "shard", "filter": {"EP": "*"},
                           "devices": devices, "ep": EP,
                           "stream": a2a})
    ds.append({"op": "schedule", "name": schedule})
    return ds


def model_file(preset, batch):
    path = os.path.join(WORK, "%s-b%d.mlir" % (preset, batch))
    if not os.path.exists(path):
        subprocess.run([PIPERC, "model", preset, "--batch", str(batch), "-o",
                        path], check=True)
    return path


def compile_plans(preset, batch, schedule, zero, a2a, memory=None):
    """(plans folder, piperc output) or (None, error text)."""
    tag = "%s-b%d-%s-z%d-%s" % (preset, batch, schedule, zero,
                                 a2a)
    strat = os.path.join(WORK, tag + ".json")
    with open(strat, "w") as f:
        json.dump(strategy(schedule, zero, a2a), f)
    out = os.path.join(WORK, tag)
    cmd = [PIPERC, "compile", model_file(preset, batch), "--strategy", strat,
           "--dtype", "bf16", "-o", out]
    if memory:
        cmd += ["--device-memory", memory]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        return None, proc.stdout
    return out, proc.stdout


UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def seconds(text):
    value, unit = text.split()
    return float(value) * UNITS[unit]


def simulate(plans, machine):
    """(step seconds, worst bubble fraction) from piper-plan --simulate."""
    out = subprocess.run([PIPER_PLAN, plans, "--simulate", "--machine",
                          machine], stdout=subprocess.PIPE, text=True,
                         check=True).stdout
    step = seconds(re.search(r"^step: ([\d.]+ \w+)", out, re.M).group(1))
    bubbles = [float(b) / 100 for b in
               re.findall(r"^class \d+ .*bubble ([\d.]+)%", out, re.M)]
    return step, max(bubbles)


def peak_mib(output):
    return max(float(p) for p in
               re.findall(r"predicted peak ([\d.]+) MiB per rank", output))


def largest_batch(preset, schedule, zero):
    """The largest microbatch size whose plans fit in DEVICE_MEMORY
    (doubling, then bisection), or 0 when even one sequence does not."""
    fits = lambda b: compile_plans(preset, b, schedule, zero, "ep_stream",
                                   DEVICE_MEMORY)[0] is not None
    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= 256 and fits(hi):
        lo, hi = hi, hi * 2
    if hi > 256:
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def main():
    os.makedirs(WORK, exist_ok=True)
    names = []
    for i, path in enumerate(MACHINES):
        with open(path) as f:
            machine = json.load(f)
        names.append(os.path.splitext(os.path.basename(path))[0])
        print("machine %d %s: %.0f TFLOP/s, HBM %.1f TB/s, link %.0f GB/s + "
              "%.0f us%s" % (i + 1, names[-1],
                             machine["flops_per_second"] / 1e12,
                             machine["memory_bytes_per_second"] / 1e12,
                             machine["link_bytes_per_second"] / 1e9,
                             machine["link_latency_seconds"] * 1e6,
                             ", one compute engine per device"
                             if machine.get("share_compute") else ""))
    print("PP %d x DP %d x EP %d, %d microbatches per replica, bf16; memory "
          "%s per device; microbatches of 1 sequence for the step and peak"
          % (PP, DP, EP, MICROBATCHES, DEVICE_MEMORY))
    results = {}
    for preset in MODELS:
        print()
        print("%-5s %-16s %-4s %-7s %s %8s %10s %9s" %
              ("model", "schedule", "zero", "a2a",
               " ".join("%9s" % ("step%d(ms)" % (i + 1))
                        for i in range(len(MACHINES))),
               "bubble", "peak(GiB)", "max batch"))
        for schedule in SCHEDULES:
            for zero in ZERO:
                batch_max = None
                for label, a2a in A2A:
                    plans, output = compile_plans(preset, 1, schedule, zero,
                                                  a2a)
                    if plans is None:
                        reason = next(
                            (l for l in output.splitlines() if "error" in l),
                            output.strip())
                        reason = reason[reason.find("):") + 2:].strip() \
                            if "):" in reason else reason
                        print("%-5s %-16s %-4d %-7s refused: %s" %
                              (preset[-2:], schedule, zero, label,
                               reason[:110]))
                        break
                    sims = [simulate(plans, m) for m in MACHINES]
                    steps = [t for t, _ in sims]
                    bubble = sims[0][1]
                    peak = peak_mib(output) / 1024
                    if label == "own":
                        batch_max = largest_batch(preset, schedule, zero)
                    results[(preset, schedule, zero, label)] = (
                        steps, bubble, peak, batch_max)
                    print("%-5s %-16s %-4d %-7s %s %7.1f%% %10.1f %9s" %
                          (preset[-2:], schedule, zero, label,
                           " ".join("%9.1f" % (t * 1e3) for t in steps),
                           bubble * 100, peak,
                           batch_max if label == "own" else ""))
        ratios(preset, results)


def ratios(preset, results):
    """The paper's comparisons, from this run's numbers (machine 1; the
    all-to-all streams on every machine)."""
    def get(schedule, zero, label="own"):
        return results.get((preset, schedule, zero, label))
    base = get("1f1b", 0)
    print("%s: throughput against 1F1B (ZeRO 0, all-to-alls on their own "
          "stream), batch 1, machine 1:" % preset)
    for schedule in SCHEDULES:
        for zero in ZERO:
            r = get(schedule, zero)
            if r and base:
                print("  %-16s zero %d: %+.1f%% throughput, largest batch "
                      "%s vs %s" % (schedule, zero,
                                    (base[0][0] / r[0][0] - 1) * 100, r[3],
                                    base[3]))
    for schedule in ("dualpipev", "dualpipe"):
        for zero in ZERO:
            own = get(schedule, zero)
            if not own:
                continue
            for i in range(len(MACHINES)):
                others = ", ".join(
                    "%s %.1f ms (%+.1f%%)" % (
                        label, get(schedule, zero, label)[0][i] * 1e3,
                        (get(schedule, zero, label)[0][i] / own[0][i] - 1)
                        * 100)
                    for label, _ in A2A[1:] if get(schedule, zero, label))
                print("  %s zero %d all-to-alls, machine %d: own stream "
                      "%.1f ms; %s" % (schedule, zero, i + 1,
                                       own[0][i] * 1e3, others))


if __name__ == "__main__":
    main()
