#!/usr/bin/env python3
"""Calibrates a machine file for the CPU backend and checks the simulator
against piper-run on it (docs/search.md §5).

Calibration (measurements none of the checked strategies is among):
- flops_per_second and memory_bytes_per_second: one rank training the model
  alone at 2 and 8 microbatches; the FLOP rate that makes the simulator's
  growth from 2 to 8 the measured one, the memory rate that makes the step
  at 2 the measured one (the optimizer's update is memory-bound; a segment
  takes the longer of its FLOPs and its bytes);
- link_bytes_per_second and link_latency_seconds: Gloo between two ranks of
  this host, from TP 2 runs of two other model widths (the time beyond the
  compute per all-reduce).
Then every strategy of a sweep on 2 ranks (one core each) is compiled,
simulated with that machine and measured; it prints predicted / measured per
strategy, the largest error and the Spearman rank correlation, and writes the
machine file. A benchmark, not a test: timings depend on the host.

Usage: bench/calibrate_cpu.py PIPERC PIPER_PLAN PIPER_RUN [OUT.json]
"""
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

PIPERC, PIPER_PLAN, PIPER_RUN = sys.argv[1:4]
OUT = sys.argv[4] if len(sys.argv) > 4 else None
STEPS = 6
ENV = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, env=ENV, timeout=900)
    if p.returncode:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), p.stdout))
    return p.stdout


def model(work, name, hidden, seq, batch=2):
    path = os.path.join(work, name + ".mlir")
    run([PIPERC, "model", "llama", "--layers", "4", "--hidden", str(hidden),
         "--heads", "8", "--kv-heads", "4", "--vocab", "512", "--seq",
         str(seq), "--batch", str(batch), "-o", path])
    return path


def measure(work, mlir, flags, ranks, plans="plans"):
    out = os.path.join(work, plans)
    run([PIPERC, "compile", mlir, "-o", out] + flags)
    metrics = os.path.join(work, "metrics.jsonl")
    run([PIPER_RUN, out, "--nproc", str(ranks), "--backend", "cpu", "--steps",
         str(STEPS), "--metrics", metrics])
    with open(metrics) as f:
        times = [json.loads(l)["step_time_s"] for l in f if l.strip()]
    return out, statistics.median(times[2:])


def predict(out, machine):
    path = out + "-machine.json"
    with open(path, "w") as f:
        json.dump(machine, f)
    text = run([PIPER_PLAN, out, "--simulate", "--machine", path])
    m = re.search(r"^step: ([0-9.]+) (s|ms|us)", text, re.M)
    return float(m.group(1)) / {"s": 1, "ms": 1e3, "us": 1e6}[m.group(2)]


def solve(machine_at, predicted, target):
    """The rate r (FLOP/s or bytes/s) at which predicted(machine_at(r)) is
    `target`: the prediction falls as the rate grows (bisection on log r
    between 1e6 and 1e15)."""
    lo, hi = 6.0, 15.0
    for _ in range(40):
        mid = (lo + hi) / 2
        if predicted(machine_at(10 ** mid)) > target:
            lo = mid
        else:
            hi = mid
    return 10 ** ((lo + hi) / 2)


def spearman(a, b):
    def ranks(x):
        order = sorted(range(len(x)), key=lambda i: x[i])
        r = [0] * len(x)
        for k, i in enumerate(order):
            r[i] = k
        return r
    ra, rb = ranks(a), ranks(b)
    n = len(a)
    return 1 - 6 * sum((x - y) ** 2 for x, y in zip(ra, rb)) / (n * (n * n - 1))


def main():
    work = tempfile.mkdtemp(prefix="piper-calibrate-")
    machine = {"memory_bytes_per_second": 0,
               "link_bytes_per_second": 0, "link_latency_seconds": 0,
               "share_compute": True}
    mlir = model(work, "m", 256, 256)
    # Compute and memory: one rank alone at 2 and 8 microbatches of the same
    # size (a batch of 8 sequences). The step grows by the microbatches'
    # compute (the FLOP rate); what does not grow, the optimizer's update of
    # every parameter and state, is memory-bound (the memory rate: a
    # segment takes the longer of its FLOPs and its bytes, docs/simulator.md).
    big = model(work, "c", 256, 256, batch=8)
    out2, t2 = measure(work, big, ["--microbatches", "2"], 1, "c2")
    out8, t8 = measure(work, big, ["--microbatches", "8"], 1, "c8")
    machine["flops_per_second"] = 1e12
    for _ in range(3):
        machine["flops_per_second"] = solve(
            lambda f: dict(machine, flops_per_second=f),
            lambda mach: predict(out8, mach) - predict(out2, mach), t8 - t2)
        free = dict(machine, memory_bytes_per_second=0)
        if predict(out2, free) < t2:
            machine["memory_bytes_per_second"] = solve(
                lambda m: dict(machine, memory_bytes_per_second=m),
                lambda mach: predict(out2, mach), t2)
    # Links: TP 2 on two other widths; the time over the compute-only
    # prediction, per all-reduce of one microbatch's activations, is
    # latency + bytes / bandwidth (a ring of 2 sends each rank's half and
    # receives the other's: 2 (n - 1) / n = 1; one latency a collective,
    # docs/simulator.md).
    samples = []
    for hidden in (128, 512):
        m = model(work, "link%d" % hidden, hidden, 256)
        out, t = measure(work, m, ["--tp", "2", "--microbatches", "2"], 2)
        reduces = run([PIPER_PLAN, out]).count(": ALL_REDUCE ")
        act = 2 * 256 * hidden * 4  # one microbatch's activations, f32
        samples.append((act, (t - predict(out, machine)) / max(reduces, 1)))
    (b1, s1), (b2, s2) = samples
    per_byte = max((s2 - s1) / (b2 - b1), 1e-12)
    machine["link_bytes_per_second"] = 1 / per_byte
    machine["link_latency_seconds"] = max(s1 - b1 * per_byte, 0)
    print("machine:", json.dumps(machine))
    sweep = [
        ("pp1 dp2", ["--dp", "2", "--microbatches", "1"]),
        ("pp1 dp2 zero2", ["--dp", "2", "--zero", "2", "--microbatches", "1"]),
        ("pp2 1f1b mb2", ["--pp", "2", "--microbatches", "2"]),
        ("pp2 1f1b mb8", ["--pp", "2", "--microbatches", "8"]),
        ("pp2 gpipe mb4", ["--pp", "2", "--microbatches", "4", "--schedule", "gpipe"]),
        ("pp2 zb-h1 mb4", ["--pp", "2", "--microbatches", "4", "--schedule", "zb-h1"]),
        ("tp2", ["--tp", "2", "--microbatches", "2"]),
        ("tp2 sp", ["--tp", "2", "--sp", "--microbatches", "2"]),
        ("cp2", ["--cp", "2", "--microbatches", "2"]),
        ("pp2 recompute", ["--pp", "2", "--microbatches", "4", "--recompute", "full"]),
    ]
    predicted, measured = [], []
    print("%-16s %12s %12s %8s" % ("strategy", "predicted s", "measured s", "ratio"))
    for name, flags in sweep:
        out, t = measure(work, mlir, flags, 2)
        p = predict(out, machine)
        predicted.append(p)
        measured.append(t)
        print("%-16s %12.4f %12.4f %8.2f" % (name, p, t, p / t))
    worst = max(abs(p / t - 1) for p, t in zip(predicted, measured))
    print("largest error %.1f%%, Spearman %.2f over %d strategies" %
          (100 * worst, spearman(predicted, measured), len(sweep)))
    if OUT:
        with open(OUT, "w") as f:
            json.dump(machine, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
