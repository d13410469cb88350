#!/usr/bin/env python3
"""Calibrates a machine file for the CPU backend and checks the simulator
against piper-run on it (docs/search.md §5).

Calibration (measurements none of the checked strategies is among):
- flops_per_second: one rank training the model alone at 2 and 8
  microbatches; the FLOP rate that makes the simulator's growth from 2 to 8
  the measured one;
- memory_bytes_per_second: one rank of a wide model on few tokens at 1 and
  2 microbatches; the memory rate that makes what does not grow with the
  microbatches (the optimizer's memory-bound update) the measured one;
- link_latency_seconds: Gloo between the ranks of this host, from TP over
  every rank on a narrower model (many small all-reduces);
- link_bytes_per_second: from data parallelism over every rank on a wider,
  shorter model against the same model on one rank (one large all-reduce);
- comm_uses_compute: true (Gloo copies and sums on the ranks' cores).
Then every strategy of a sweep over RANKS ranks (one core each) is compiled,
simulated with that machine and measured; it prints predicted / measured per
strategy, the largest error and the Spearman rank correlation, and writes the
machine file. A benchmark, not a test: timings depend on the host.

Usage: [RANKS=N] bench/calibrate_cpu.py PIPERC PIPER_PLAN PIPER_RUN [OUT.json]
  RANKS: the ranks of the link fits and the sweep (default 2; 2 or 4). A
  host with fewer cores than ranks time-shares them, which the machine file
  cannot describe.
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
STEPS = 14
RANKS = int(os.environ.get("RANKS", "2"))
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


def solve(machine_at, predicted, target, lo=6.0, hi=15.0):
    """The rate r (FLOP/s, bytes/s, or 1 / latency) at which
    predicted(machine_at(r)) is `target`: the prediction falls as the rate
    grows (bisection on log r between 10^lo and 10^hi)."""
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


def warn_cores():
    cores = os.cpu_count() or 1
    if cores < RANKS:
        print("warning: %d ranks on %d cores: they time-share the cores, "
              "which the simulator does not model" % (RANKS, cores))


def main():
    warn_cores()
    work = tempfile.mkdtemp(prefix="piper-calibrate-")
    machine = {"memory_bytes_per_second": 0,
               "link_bytes_per_second": 0, "link_latency_seconds": 0,
               "share_compute": True, "comm_uses_compute": True}
    mlir = model(work, "m", 256, 256)
    # Compute: one rank alone at 2 and 8 microbatches of 8 sequences; the
    # step grows by the microbatches' compute (the FLOP rate).
    big = model(work, "c", 256, 256, batch=8)
    out2, t2 = measure(work, big, ["--microbatches", "2"], 1, "c2")
    out8, t8 = measure(work, big, ["--microbatches", "8"], 1, "c8")
    # Memory: what does not grow with the microbatches, the optimizer's
    # update of every parameter and state, is memory-bound (a segment takes
    # the longer of its FLOPs and its bytes, docs/simulator.md). It is
    # measured where it is a large share of the step: one rank of a wide
    # model on few tokens (hidden 512, one sequence of 32) at 1 and 2
    # microbatches, 2 t(1) - t(2). (On the models above it is 1 % of the
    # step, less than the noise of one measurement.)
    few = model(work, "mem512", 512, 32, batch=1)
    few1, f1 = measure(work, few, ["--microbatches", "1"], 1, "mem1")
    few2, f2 = measure(work, few, ["--microbatches", "2"], 1, "mem2")
    machine["flops_per_second"] = 1e12
    for _ in range(3):
        machine["flops_per_second"] = solve(
            lambda f: dict(machine, flops_per_second=f),
            lambda mach: predict(out8, mach) - predict(out2, mach), t8 - t2)
        fixed = lambda mach: 2 * predict(few1, mach) - predict(few2, mach)
        if fixed(dict(machine, memory_bytes_per_second=0)) < 2 * f1 - f2:
            machine["memory_bytes_per_second"] = solve(
                lambda m: dict(machine, memory_bytes_per_second=m), fixed,
                2 * f1 - f2)
    # Links, each fitted with the simulator (alternately: each depends
    # mostly on its own). Latency: TP over every rank on a narrower model
    # (hidden 128): small all-reduces on the critical path, two a block
    # forward and two backward, a microbatch. Bandwidth: the one all-reduce
    # of every gradient (46 MB) of a wider, shorter model (hidden 512,
    # sequence 64) at data parallelism over every rank, against the same
    # model on one rank: what the other ranks add is that all-reduce and
    # nothing else, so the fit does not rest on the compute rate at another
    # width.
    r = str(RANKS)
    tp = model(work, "tp128", 128, 256)
    tp_out, t_tp = measure(work, tp, ["--tp", r, "--microbatches", "2"], RANKS,
                           "tp128")
    wide = model(work, "dp512", 512, 64)
    one_out, t_one = measure(work, wide, ["--microbatches", "1"], 1, "one512")
    dp_out, t_dp = measure(work, wide, ["--dp", r, "--microbatches", "1"],
                           RANKS, "dp512")
    machine["link_latency_seconds"] = 0
    for _ in range(3):
        machine["link_latency_seconds"] = 1 / solve(
            lambda x: dict(machine, link_latency_seconds=1 / x),
            lambda mach: predict(tp_out, mach), t_tp, lo=1.0, hi=9.0)
        machine["link_bytes_per_second"] = solve(
            lambda b: dict(machine, link_bytes_per_second=b),
            lambda mach: predict(dp_out, mach) - predict(one_out, mach),
            t_dp - t_one)
    print("machine:", json.dumps(machine))
    # The sweep: every axis over all the ranks (pipelines of RANKS, 4 x
    # RANKS and 2 x RANKS microbatches).
    mb1x, mb2x, mb4x = str(RANKS), str(2 * RANKS), str(4 * RANKS)
    sweep = [
        ("pp1 dp" + r, ["--dp", r, "--microbatches", "1"]),
        ("pp1 dp%s zero2" % r, ["--dp", r, "--zero", "2", "--microbatches", "1"]),
        ("pp1 dp%s zero3" % r, ["--dp", r, "--zero", "3", "--microbatches", "2"]),
        ("pp%s 1f1b mb%s" % (r, mb1x), ["--pp", r, "--microbatches", mb1x]),
        ("pp%s 1f1b mb%s" % (r, mb4x), ["--pp", r, "--microbatches", mb4x]),
        ("pp%s gpipe mb%s" % (r, mb2x), ["--pp", r, "--microbatches", mb2x, "--schedule", "gpipe"]),
        ("pp%s zb-h1 mb%s" % (r, mb2x), ["--pp", r, "--microbatches", mb2x, "--schedule", "zb-h1"]),
        ("tp" + r, ["--tp", r, "--microbatches", "2"]),
        ("tp%s sp" % r, ["--tp", r, "--sp", "--microbatches", "2"]),
        ("cp" + r, ["--cp", r, "--microbatches", "2"]),
        ("pp%s recompute" % r, ["--pp", r, "--microbatches", mb2x, "--recompute", "full"]),
    ]
    predicted, measured = [], []
    print("%-16s %12s %12s %8s" % ("strategy", "predicted s", "measured s", "ratio"))
    for name, flags in sweep:
        out, t = measure(work, mlir, flags, RANKS)
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
